"""The scripted workflow's ``forward``: request tensors in, each node's kernel run on what its
parents returned, the workflow's outputs in the wire format out.

Nodes are fed as NVTabular's executor feeds them (later parents win on shared columns, columns no
parent returned come from the request, parents without rows are dropped); ``compiler`` lets a node
into TorchScript only when all its parents hold the same rows, so a node whose parents returned no
rows (a Filter kept none) returns none either. The request is checked where it enters, as the
python steps check it: equal row counts, ragged offsets that describe their values, no nulls in
the columns that must hold none.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import torch

from merlin_torch_serving.aot import exportable
from merlin_torch_serving.scripted_workflow.ragged import check_offsets, refusal


def _wire_cast(name: str, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if values.dtype == dtype:
        return values
    to_integers = values.is_floating_point() and not torch.empty(0, dtype=dtype).is_floating_point()
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            if to_integers:
                torch._assert_async(
                    ~torch.isnan(values).any(),
                    "output column '" + name + "' holds nulls (NaN), but its schema dtype cannot"
                    " hold them; fill the nulls in the workflow (e.g. FillMissing)",
                )
            return values.to(dtype)
    if to_integers and bool(torch.isnan(values).any()):
        raise ValueError(
            "output column '"
            + name
            + "' holds nulls (NaN), but its schema dtype cannot hold them; fill the nulls in"
            + " the workflow (e.g. FillMissing) or give the column a float dtype"
        )
    return values.to(dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    """numpy's name of a dtype, as the library's messages give dtypes (TorchScript holds a dtype
    as a number, whose text is that number)."""
    names = [
        (torch.bool, "bool"),
        (torch.uint8, "uint8"),
        (torch.int8, "int8"),
        (torch.int16, "int16"),
        (torch.int32, "int32"),
        (torch.int64, "int64"),
        (torch.float16, "float16"),
        (torch.float32, "float32"),
        (torch.float64, "float64"),
    ]
    for known, name in names:
        if dtype == known:
            return name
    return "another dtype"


class WorkflowScript(torch.nn.Module):
    """A fitted workflow as one TorchScript module (built by ``compiler.script_workflow``)."""

    scalar_inputs: list[str]
    ragged_inputs: list[str]
    fixed_inputs: list[str]
    non_null_inputs: list[str]
    parents: list[list[int]]
    request_columns: list[list[str]]
    input_dtypes: dict[str, torch.dtype]
    outputs: list[str]
    ragged_outputs: list[str]
    widths: dict[str, int]
    output_dtypes: dict[str, torch.dtype]

    def __init__(
        self,
        kernels: list[torch.nn.Module],
        inputs: dict[str, list[str]],
        input_dtypes: dict[str, torch.dtype],
        non_null_inputs: list[str],
        parents: list[list[int]],
        request_columns: list[list[str]],
        outputs: list[str],
        ragged_outputs: list[str],
        widths: dict[str, int],
        output_dtypes: dict[str, torch.dtype],
    ):
        super().__init__()
        self.kernels = torch.nn.ModuleList(kernels)
        self.scalar_inputs = inputs["scalar"]
        self.ragged_inputs = inputs["ragged"]
        self.fixed_inputs = inputs["fixed"]
        self.input_dtypes = input_dtypes
        self.non_null_inputs = non_null_inputs
        self.parents = parents
        self.request_columns = request_columns
        self.outputs = outputs
        self.ragged_outputs = ragged_outputs
        self.widths = widths
        self.output_dtypes = output_dtypes

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        values, offsets, rows = self.request(inputs)
        # a package cannot branch on row counts: it runs every kernel, which answer no rows
        # for none, where TorchScript skips them
        exporting = False
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
            if torch.compiler.is_exporting():
                exporting = True
        if not exporting and rows == 0:
            return self.empty()
        results: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]] = []
        for position, kernel in enumerate(self.kernels):
            merged: dict[str, torch.Tensor] = {}
            merged_offsets: dict[str, torch.Tensor] = {}
            node_rows = rows
            fed = len(self.parents[position]) == 0
            for parent in self.parents[position]:
                parent_values, parent_offsets, parent_rows = results[parent]
                if not exporting and parent_rows == 0:
                    continue  # NVTabular drops the parents that returned no rows
                fed = True
                node_rows = parent_rows
                for name, column in parent_values.items():
                    merged[name] = column
                    if name in parent_offsets:
                        merged_offsets[name] = parent_offsets[name]
                    elif name in merged_offsets:
                        merged_offsets.pop(name)
            if fed:
                for name in self.request_columns[position]:
                    merged[name] = values[name]
                    if name in offsets:
                        merged_offsets[name] = offsets[name]
                results.append(kernel(merged, merged_offsets, node_rows))
            else:
                results.append(({}, {}, 0))
        output_values, output_offsets, output_rows = results[-1]
        if not exporting and output_rows == 0:
            return self.empty()
        return self.wire(output_values, output_offsets, output_rows)

    def request(
        self, inputs: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        """The request's columns, checked: equal row counts, valid offsets, no forbidden nulls."""
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
            if torch.compiler.is_exporting():
                return self.exported_request(inputs)
        values: dict[str, torch.Tensor] = {}
        offsets: dict[str, torch.Tensor] = {}
        rows: list[int] = []
        for name in self.scalar_inputs:
            values[name] = inputs[name]
            rows.append(inputs[name].shape[0])
        for name in self.ragged_inputs:
            column = inputs[name + "__values"]
            row_offsets = inputs[name + "__offsets"].to(torch.int64)
            check_offsets(name, column, row_offsets)
            values[name] = column
            offsets[name] = row_offsets
            rows.append(row_offsets.shape[0] - 1)
        for name in self.fixed_inputs:
            column = inputs[name]
            width = column.shape[1]
            values[name] = column.reshape(-1)
            offsets[name] = torch.arange(column.shape[0] + 1, dtype=torch.int64) * width
            rows.append(column.shape[0])
        names = self.scalar_inputs + self.ragged_inputs + self.fixed_inputs
        for name in names:
            if values[name].dtype != self.input_dtypes[name]:
                raise ValueError(
                    refusal(
                        name,
                        _dtype_name(self.input_dtypes[name]) + " values",
                        _dtype_name(values[name].dtype) + " values",
                    )
                )
        for position in range(len(rows)):
            if rows[position] != rows[0]:
                raise ValueError(
                    refusal(
                        names[position],
                        str(rows[0]) + " rows, like '" + names[0] + "'",
                        str(rows[position]) + " rows",
                    )
                )
        for name in self.non_null_inputs:
            if bool(torch.isnan(values[name]).any()):
                raise ValueError(refusal(name, "no null (NaN) values", "a null value"))
        return values, offsets, rows[0] if len(rows) > 0 else 0

    def exported_request(self, inputs: dict[str, torch.Tensor]):
        """``request`` as torch.export traces it: each column brought to the first one's rows, a
        mismatch refused by an assertion naming it (dtypes are the package's by construction)."""
        values: dict[str, torch.Tensor] = {}
        offsets: dict[str, torch.Tensor] = {}
        rows_of = {}
        for name in self.scalar_inputs + self.fixed_inputs:
            rows_of[name] = inputs[name].shape[0]
        for name in self.ragged_inputs:
            rows_of[name] = torch.sym_max(inputs[name + "__offsets"].shape[0] - 1, 0)
        first = next(iter(rows_of), "")
        rows = rows_of.get(first, 0)
        for name, count in rows_of.items():
            if name != first:
                exportable.assert_rows(name, count, first, rows)
        for name in self.scalar_inputs:
            values[name] = (
                inputs[name] if name == first else exportable.rows_like(inputs[name], rows)
            )
        for name in self.ragged_inputs:
            column = inputs[name + "__values"]
            row_offsets = inputs[name + "__offsets"].to(torch.int64)
            exportable.assert_offsets(name, column, row_offsets)
            values[name] = column
            offsets[name] = exportable.rows_like(row_offsets, rows + 1, column.shape[0])
        for name in self.fixed_inputs:
            column = inputs[name] if name == first else exportable.rows_like(inputs[name], rows)
            values[name] = column.reshape(-1)
            offsets[name] = torch.arange(rows + 1, dtype=torch.int64) * column.shape[1]
        for name in self.non_null_inputs:
            if values[name].is_floating_point():
                torch._assert_async(
                    ~torch.isnan(values[name]).any(),
                    refusal(name, "no null (NaN) values", "a null value"),
                )
        return values, offsets, rows

    def wire(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> dict[str, torch.Tensor]:
        """The output columns in the wire format, cast to the output schema's dtypes."""
        wire: dict[str, torch.Tensor] = {}
        for name in self.outputs:
            column = _wire_cast(name, values[name], self.output_dtypes[name])
            if name in self.ragged_outputs:
                wire[name + "__values"] = column
                wire[name + "__offsets"] = offsets[name].to(torch.int32)
            elif name in self.widths:
                width = self.widths[name]
                lengths = offsets[name][1:] - offsets[name][:-1]
                if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves it out)
                    if torch.compiler.is_exporting():
                        wire[name] = exportable.fixed_rows(name, column, lengths, rows, width)
                        continue
                if bool((lengths != width).any()):
                    raise ValueError(
                        "output column '"
                        + name
                        + "' is a list of "
                        + str(width)
                        + " values per row in the output schema, but a row holds "
                        + str(int(lengths[lengths != width][0]))
                        + "; pad the list (ListSlice(pad=True)) or declare the column ragged"
                    )
                wire[name] = column.reshape([rows, width])
            else:
                wire[name] = column
        return wire

    def empty(self) -> dict[str, torch.Tensor]:
        """The wire format of zero rows for every output column."""
        wire: dict[str, torch.Tensor] = {}
        for name in self.outputs:
            dtype = self.output_dtypes[name]
            if name in self.ragged_outputs:
                wire[name + "__values"] = torch.zeros(0, dtype=dtype)
                wire[name + "__offsets"] = torch.zeros(1, dtype=torch.int32)
            elif name in self.widths:
                wire[name] = torch.zeros([0, self.widths[name]], dtype=dtype)
            else:
                wire[name] = torch.zeros(0, dtype=dtype)
        return wire
