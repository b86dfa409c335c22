"""The scripted workflow's answer lined up with the request's sessions: one row per session, in the
order sessions first appear, a placeholder row (the key, empty lists, zeros) for each session the
workflow's filters dropped, marked True in the filtered column (the TorchScript counterpart of
``ops.session_rows.line_up_sessions``, which the python step runs).
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import torch

from merlin_torch_serving.aot import exportable
from merlin_torch_serving.scripted_workflow.graph import WorkflowScript
from merlin_torch_serving.scripted_workflow.ragged import take_rows


def first_appearance_order(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct keys in the order they first appear, and the distinct keys sorted."""
    rows = keys.shape[0]
    distinct, inverse = torch.unique(keys, sorted=True, return_inverse=True)
    first = torch.full([distinct.shape[0]], rows, dtype=torch.int64).scatter_reduce(
        0, inverse, torch.arange(rows, dtype=torch.int64), "amin", include_self=True
    )
    return distinct.index_select(0, torch.argsort(first)), distinct


def row_of_each_key(output_keys: torch.Tensor, answer_keys: torch.Tensor) -> torch.Tensor:
    """For each answer key, its row in ``output_keys``; -1 where it has none."""
    rows = torch.full(answer_keys.shape, -1, dtype=torch.int64)
    exporting = False
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():
            exporting = True
    if not exporting and output_keys.shape[0] == 0:
        return rows
    order = torch.sort(output_keys, stable=True)[1]
    sorted_keys = output_keys.index_select(0, order)
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if exporting:  # no keys at all reads nothing
            positions = torch.searchsorted(sorted_keys, answer_keys)
            found = exportable.take_safely(sorted_keys, positions) == answer_keys
            found = found & (positions < sorted_keys.shape[0])
            return torch.where(found, exportable.take_safely(order, positions), rows)
    positions = torch.clamp(torch.searchsorted(sorted_keys, answer_keys), max=order.shape[0] - 1)
    found = sorted_keys.index_select(0, positions) == answer_keys
    return torch.where(found, order.index_select(0, positions), rows)


class LinedUpSessions(torch.nn.Module):
    """The workflow's wire outputs, one row per request session (see the module's docstring)."""

    key: str
    filtered_column: str  # "" when the workflow cannot drop sessions
    ragged: list[str]
    fixed: dict[str, int]
    scalars: list[str]

    def __init__(self, workflow: WorkflowScript, key: str, filtered_column: str):
        super().__init__()
        self.workflow = workflow
        self.key = key
        self.filtered_column = filtered_column
        self.ragged = list(workflow.ragged_outputs)
        self.fixed = dict(workflow.widths)
        self.scalars = [
            name for name in workflow.outputs if name not in self.ragged and name not in self.fixed
        ]

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
            if torch.compiler.is_exporting():
                return self.exported_forward(inputs)
        answer = self.workflow(inputs)
        answer_keys, request_keys = first_appearance_order(inputs[self.key])
        output_keys = answer[self.key]
        if output_keys.shape[0] > 0:
            known = torch.clamp(
                torch.searchsorted(request_keys, output_keys), max=request_keys.shape[0] - 1
            )
            if not bool(torch.equal(request_keys.index_select(0, known), output_keys)):
                raise ValueError(
                    "the workflow answered for '"
                    + self.key
                    + "' values the request did not send; it changes the key it groups by, so"
                    + " its sessions cannot be matched to the request's. Pass"
                    + " TransformWorkflow(..., keep_request_order=False) to take its rows as"
                    + " they come"
                )
        rows = row_of_each_key(output_keys, answer_keys)
        missing = rows < 0
        count = int(missing.sum())
        if count > 0 and self.filtered_column == "":
            raise ValueError(
                "the workflow dropped sessions although it has no Filter; every session of a"
                + " request needs a row"
            )
        if count > 0:
            answer = self._with_placeholders(answer, answer_keys[missing], output_keys.shape[0])
            rows = rows.clone()
            rows[missing] = output_keys.shape[0] + torch.arange(count, dtype=torch.int64)
        lined_up: dict[str, torch.Tensor] = {}
        if count == 0 and bool(torch.equal(rows, torch.arange(rows.shape[0]))):
            # the workflow answered in request order already (one session, say): as it is
            for name, column in answer.items():
                lined_up[name] = column
            if self.filtered_column != "":
                lined_up[self.filtered_column] = missing
            return lined_up
        for name in self.scalars:
            lined_up[name] = answer[name].index_select(0, rows)
        for name in self.fixed:
            lined_up[name] = answer[name].index_select(0, rows)
        for name in self.ragged:
            values, offsets = take_rows(
                answer[name + "__values"], answer[name + "__offsets"].to(torch.int64), rows
            )
            lined_up[name + "__values"] = values
            lined_up[name + "__offsets"] = offsets.to(torch.int32)
        if self.filtered_column != "":
            lined_up[self.filtered_column] = missing
        return lined_up

    def exported_forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``forward`` as torch.export traces it: no branch on what the request holds, its checks
        assertions, the placeholder rows appended and the rows reordered always."""
        answer = self.workflow(inputs)
        answer_keys, request_keys = first_appearance_order(inputs[self.key])
        output_keys = answer[self.key]
        known = torch.searchsorted(request_keys, output_keys)
        torch._assert_async(
            (exportable.take_safely(request_keys, known) == output_keys).all(),
            "the workflow answered for '"
            + self.key
            + "' values the request did not send; it changes the key it groups by, so its"
            + " sessions cannot be matched to the request's. Pass"
            + " TransformWorkflow(..., keep_request_order=False) to take its rows as they come",
        )
        rows = row_of_each_key(output_keys, answer_keys)
        missing = rows < 0
        if self.filtered_column == "":
            torch._assert_async(
                ~missing.any(),
                "the workflow dropped sessions although it has no Filter; every session of a"
                + " request needs a row",
            )
        answer = self._with_placeholders(answer, answer_keys[missing], output_keys.shape[0])
        appended = output_keys.shape[0] + torch.cumsum(missing.to(torch.int64), 0) - 1
        rows = torch.where(missing, appended, rows)
        lined_up: dict[str, torch.Tensor] = {}
        for name in self.scalars:
            lined_up[name] = answer[name].index_select(0, rows)
        for name in self.fixed:
            lined_up[name] = answer[name].index_select(0, rows)
        for name in self.ragged:
            values, offsets = take_rows(
                answer[name + "__values"], answer[name + "__offsets"].to(torch.int64), rows
            )
            lined_up[name + "__values"] = values
            lined_up[name + "__offsets"] = offsets.to(torch.int32)
        if self.filtered_column != "":
            lined_up[self.filtered_column] = missing
        return lined_up

    def _with_placeholders(
        self, answer: dict[str, torch.Tensor], keys: torch.Tensor, rows: int
    ) -> dict[str, torch.Tensor]:
        """``answer`` with one row appended per key: the key, empty lists, zeros."""
        count = keys.shape[0]
        extended: dict[str, torch.Tensor] = {}
        for name in self.scalars:
            column = answer[name]
            extra = keys.to(column.dtype) if name == self.key else column.new_zeros([count])
            extended[name] = torch.cat([column, extra])
        for name, width in self.fixed.items():
            column = answer[name]
            extended[name] = torch.cat([column, column.new_zeros([count, width])])
        for name in self.ragged:
            offsets = answer[name + "__offsets"]
            extended[name + "__values"] = answer[name + "__values"]
            extended[name + "__offsets"] = torch.cat([offsets, offsets[-1:].repeat(count)])
        return extended
