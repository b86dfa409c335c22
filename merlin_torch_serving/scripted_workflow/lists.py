"""Scripted NVTabular ``ListSlice``: python slice semantics on every row at once, padding included
(the counterpart of ``fastpath.lists``).

Like NVTabular on CPU, padding extends rows held as python lists (Groupby's) and leaves rows held as
numpy arrays as they are; whether a column's rows are lists is known at export.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import numpy as np
import torch
from merlin.dag import ColumnSelector
from nvtabular.ops import ListSlice

from merlin_torch_serving.aot import exportable
from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.fastpath.lists import ListSliceKernel
from merlin_torch_serving.scripted_workflow.columns import LIST_CELLS, ColumnType, torch_dtype
from merlin_torch_serving.scripted_workflow.ragged import offsets_from_lengths, segment_positions


def _bound(index: int, row_lengths: torch.Tensor) -> torch.Tensor:
    """Where a python slice bound lands in each row: negatives count from the end, then clamp."""
    if index < 0:
        return torch.minimum(torch.clamp(row_lengths + index, min=0), row_lengths)
    return torch.clamp(row_lengths, max=index)


def _total(offsets: torch.Tensor) -> int:
    """The values ``offsets`` end at (a size a package reads when it runs)."""
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            return exportable.size_of(offsets[-1])
    return int(offsets[-1])


class ListSliceScript(torch.nn.Module):
    """Slices each selected list column to ``[start:end]``; returns only those columns. Columns in
    ``padded`` are brought to ``max_elements`` values with ``pad_value`` in ``pad_dtypes``."""

    names: list[str]
    padded: list[str]
    pad_dtypes: dict[str, torch.dtype]
    start: int
    end: int
    max_elements: int
    pad_value: float

    def __init__(self, names, padded, pad_dtypes, start, end, max_elements, pad_value):
        super().__init__()
        self.names = list(names)
        self.padded = list(padded)
        self.pad_dtypes = dict(pad_dtypes)
        self.start = start
        self.end = end
        self.max_elements = max_elements
        self.pad_value = float(pad_value)

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        sliced: dict[str, torch.Tensor] = {}
        sliced_offsets: dict[str, torch.Tensor] = {}
        exporting = False
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
            if torch.compiler.is_exporting():  # a package takes the general paths always
                exporting = True
        for name in self.names:
            row_offsets = offsets[name]
            row_lengths = row_offsets[1:] - row_offsets[:-1]
            starts = _bound(self.start, row_lengths)
            kept = torch.clamp(_bound(self.end, row_lengths) - starts, min=0)
            if not exporting and bool(torch.equal(kept, row_lengths)):  # no row is cut
                kept_offsets = row_offsets
                kept_values = values[name]
            else:
                kept_offsets = offsets_from_lengths(kept)
                positions = segment_positions(row_offsets[:-1] + starts, kept)
                kept_values = values[name].index_select(0, positions)
            if name in self.padded:
                padded = torch.clamp(kept, min=self.max_elements)
                if exporting or not bool(torch.equal(padded, kept)):
                    padded_offsets = offsets_from_lengths(padded)
                    result = torch.full(
                        [_total(padded_offsets)], self.pad_value, dtype=self.pad_dtypes[name]
                    )
                    result[segment_positions(padded_offsets[:-1], kept)] = kept_values.to(
                        result.dtype
                    )
                    kept_values, kept_offsets = result, padded_offsets
            sliced[name] = kept_values
            sliced_offsets[name] = kept_offsets
        return sliced, sliced_offsets, rows


def build(op: ListSlice, selection: ColumnSelector, types: dict[str, ColumnType]):
    kernel = ListSliceKernel(op, selection)  # the fast path's own checks of the configuration
    output, padded, pad_dtypes = {}, [], {}
    for name in kernel.names:
        column = types[name]
        if not column.is_list:
            raise NotCompiled(f"ListSlice of the scalar column {name!r}")
        output[name] = column
        if kernel.pad and column.cells == LIST_CELLS:
            if column.dtype.kind not in "iuf":
                raise NotCompiled(
                    f"padding values of dtype {column.dtype} with {kernel.pad_value!r}"
                )
            # a row that mixes python ints with a float pad reads back as floats in pandas: the
            # column is float only in requests with a row to pad
            dtype = np.result_type(column.dtype, np.asarray(kernel.pad_value).dtype)
            padded.append(name)
            pad_dtypes[name] = torch_dtype(dtype, f"padded column {name!r}")
            output[name] = ColumnType(dtype, True, column.cells, varying=dtype != column.dtype)
    module = ListSliceScript(
        kernel.names,
        padded,
        pad_dtypes,
        kernel.start,
        kernel.end,
        kernel.max_elements,
        kernel.pad_value if padded else 0,
    )
    return module, output
