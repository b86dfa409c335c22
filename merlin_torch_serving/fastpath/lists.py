"""Compiled NVTabular ``ListSlice``: python slice semantics on every row at once, padding included.

Like NVTabular on CPU, padding extends rows held as python lists and leaves rows held as numpy
arrays as they are; the padded rows mix the list's values with ``pad_value``.
"""

from __future__ import annotations

import numpy as np
from merlin.dag import ColumnSelector
from nvtabular.ops import ListSlice

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.batch import LIST_CELLS, OFFSETS_DTYPE, Batch, Column
from merlin_torch_serving.fastpath.errors import Delegate, NotCompiled

_UNBOUNDED = np.iinfo(np.int64).max


class ListSliceKernel:
    """Slices each selected list column to ``[start:end]``; returns only those columns."""

    def __init__(self, op: ListSlice, selection: ColumnSelector):
        if op.pad and op.max_elements == _UNBOUNDED:
            raise NotCompiled("pad=True without a bound on the row length")
        if op.pad and (
            isinstance(op.pad_value, bool) or not isinstance(op.pad_value, (int, float))
        ):
            raise NotCompiled(f"pad_value={op.pad_value!r} is not a number")
        self.names = list(selection.names)
        self.start = int(op.start)
        self.end = int(op.end)
        self.pad = bool(op.pad)
        self.pad_value = op.pad_value
        self.max_elements = int(op.max_elements)

    def __call__(self, batch: Batch) -> Batch:
        return Batch.of({name: self._slice(name, batch[name]) for name in self.names})

    def _slice(self, name: str, column: Column) -> Column:
        if not column.is_list:
            raise Delegate(f"ListSlice of the scalar column {name!r}")
        row_lengths = column.lengths()
        starts = _bound(self.start, row_lengths)
        kept = np.maximum(_bound(self.end, row_lengths) - starts, 0)
        offsets = wire.offsets_from_lengths(kept, OFFSETS_DTYPE)
        row_starts = column.list_offsets()[:-1] + starts
        values = column.values[wire.segment_positions(row_starts, kept, offsets)]
        if not (self.pad and column.cells == LIST_CELLS):
            return Column(values, offsets, column.cells)
        padded = np.maximum(kept, self.max_elements)
        if np.array_equal(padded, kept):
            return Column(values, offsets, column.cells)
        if values.dtype.kind not in "iuf":
            raise Delegate(f"padding values of dtype {values.dtype} with {self.pad_value!r}")
        # A row that mixes python ints with a float pad reads back as floats in pandas.
        dtype = np.result_type(values.dtype, np.asarray(self.pad_value).dtype)
        padded_offsets = wire.offsets_from_lengths(padded, OFFSETS_DTYPE)
        result = np.full(padded_offsets[-1], self.pad_value, dtype=dtype)
        result[wire.segment_positions(padded_offsets[:-1], kept, offsets)] = values
        return Column(result, padded_offsets, column.cells)


def _bound(index: int, row_lengths: np.ndarray) -> np.ndarray:
    """Where a python slice bound lands in each row: negatives count from the end, then clamp."""
    if index < 0:
        return np.clip(row_lengths + index, 0, row_lengths)
    return np.minimum(index, row_lengths)
