"""BlankFilteredRows: what the graph computed for the sessions a workflow filtered out, blanked.

Those sessions reach the model as placeholder rows (see ``session_rows``); their scores and items
mean nothing, so every result downstream of the workflow is blanked on them: -1 for integers (the
missing raw id of ``DecodeItemIds``), NaN for floats, False for booleans, empty strings, and
empty lists. The ensemble adds this operator itself, at the end of the graph; ``blank_rows`` is
TorchScript, so a libtorch step blanks its own outputs the same way
(``BlankFilteredRows.torchscript``).
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.wire import TableColumn
from merlin_torch_serving.ops.base import ServingOperator


def blank_rows(values: torch.Tensor, filtered: torch.Tensor) -> torch.Tensor:
    """``values`` (``[rows, ...]``) with the rows where ``filtered`` is True set to the blank of
    its dtype: NaN for floats, False for booleans, -1 for integers."""
    exporting = False
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript leaves the block out)
        if torch.compiler.is_exporting():  # a package cannot branch on the rows; none is fine
            exporting = True
    if values.dim() == 0 or (not exporting and values.shape[0] == 0):
        return values
    mask = filtered.to(torch.bool).reshape([values.shape[0]] + [1] * (values.dim() - 1))
    if values.is_floating_point():
        blank = torch.full_like(values, float("nan"))
    elif values.dtype == torch.bool:
        blank = torch.zeros_like(values)
    else:
        blank = torch.full_like(values, -1)
    return torch.where(mask, blank, values)


def blank_value(dtype: np.dtype):
    """What a blanked cell of ``dtype`` holds (the numpy side of ``blank_rows``)."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        return -1
    return ""  # strings: None would travel as the text "None" in a BYTES tensor


class BlankRows(torch.nn.Module):
    """``blank_rows`` of each of ``columns`` on the rows where the ``filtered`` input is True."""

    filtered: str
    columns: list[str]

    def __init__(self, filtered: str, columns: list[str]):
        super().__init__()
        self.filtered = filtered
        self.columns = columns

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mark = inputs[self.filtered]
        outputs: dict[str, torch.Tensor] = {}
        for name in self.columns:
            outputs[name] = blank_rows(inputs[name], mark)
        return outputs


class BlankFilteredRows(ServingOperator):
    """Blanks ``columns`` on the rows where ``filtered_column`` is True.

    Only ``columns`` are returned.
    """

    def __init__(self, filtered_column: str, columns: Sequence[str]):
        super().__init__()
        self.filtered_column = filtered_column
        self.columns = list(columns)

    @property
    def label(self) -> str:
        return "BlankFilteredRows"

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return Schema([input_schema[name] for name in self.columns])

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        filtered = np.asarray(transformable[self.filtered_column].values, dtype=bool)
        columns: dict[str, TableColumn] = {}
        for name in self.columns:
            column = transformable[name]
            values = np.asarray(column.values)
            if column.offsets is not None:
                columns[name] = _emptied(values, np.asarray(column.offsets), filtered)
            elif filtered.any():
                blanked = values.copy()
                blanked[filtered] = blank_value(values.dtype)
                columns[name] = blanked
            else:
                columns[name] = values
        return TensorTable(columns, _unsafe=True)

    def config(self) -> dict[str, Any]:
        return {"filtered_column": self.filtered_column, "columns": self.columns}

    def exportable(self, input_schema: Schema) -> BlankRows | None:
        return self.torchscript(input_schema)

    def torchscript(self, input_schema: Schema) -> BlankRows | None:
        """Blanking in TorchScript, for numbers and booleans that are not ragged lists (emptied
        lists and strings are left to ``transform``)."""
        columns = [input_schema[name] for name in self.columns]
        if any(wire.is_ragged(c) or wire.column_numpy_dtype(c).kind not in "biuf" for c in columns):
            return None
        return BlankRows(self.filtered_column, self.columns)


def _emptied(
    values: np.ndarray, offsets: np.ndarray, filtered: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A ragged column with the filtered rows' lists emptied."""
    if not filtered.any():
        return values, offsets
    lengths = np.diff(offsets.astype(np.int64))
    kept = np.repeat(~filtered, lengths)
    return values[kept], wire.offsets_from_lengths(np.where(filtered, 0, lengths), offsets.dtype)
