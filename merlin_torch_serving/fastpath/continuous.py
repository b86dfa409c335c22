"""Compiled ``FillMissing``, ``LogOp``, ``Normalize`` and ``NormalizeMinMax``: the same numpy
arithmetic pandas runs.

pandas evaluates these element-wise with numpy on the column's values, so applying the same
operations, with the same operands and dtypes, to the same values gives the same bits.
"""

from __future__ import annotations

import numpy as np
from merlin.dag import ColumnSelector
from nvtabular.ops import FillMissing, LogOp, Normalize, NormalizeMinMax

from merlin_torch_serving.fastpath.batch import ARRAY_CELLS, Batch, Column
from merlin_torch_serving.fastpath.errors import Delegate, NotCompiled


def _numeric(name: str, column: Column) -> np.ndarray:
    if column.values.dtype.kind not in "iufb":
        raise Delegate(f"arithmetic on column {name!r} of dtype {column.values.dtype}")
    return column.values


def _rebuilt(column: Column, values: np.ndarray) -> Column:
    # NVTabular rebuilds list columns row by row as numpy arrays.
    if column.is_list:
        return Column(values, column.offsets, ARRAY_CELLS)
    return Column(values)


class FillMissingKernel:
    """``fillna(fill_val)``: NaN replaced in float columns, integer and boolean columns (which
    cannot hold NaN) unchanged; returns every input column, the selected ones filled, and with
    ``add_binary_cols`` a ``<name>_filled`` column, True where a value was missing."""

    def __init__(self, op: FillMissing, selection: ColumnSelector):
        self.names = list(selection.names)
        self.fill_value = op.fill_val
        self.add_binary_columns = op.add_binary_cols
        if isinstance(self.fill_value, (bool, np.bool_)) or not isinstance(
            self.fill_value, (int, float, np.number)
        ):
            raise NotCompiled(f"fill value {self.fill_value!r} is not a number")

    def __call__(self, batch: Batch) -> Batch:
        updates = {}
        for name in self.names:
            column = batch[name]
            if column.is_list:
                raise Delegate(f"FillMissing of the list column {name!r}")
            values = column.values
            missing = (
                np.isnan(values) if values.dtype.kind == "f" else np.zeros(len(values), dtype=bool)
            )
            if values.dtype.kind not in "iufb":
                raise Delegate(f"FillMissing of column {name!r} of dtype {values.dtype}")
            if missing.any():
                fill = values.dtype.type(self.fill_value)
                # pandas moves the column to float64 when the fill value does not fit its dtype
                if fill != self.fill_value:
                    raise Delegate(
                        f"fill value {self.fill_value!r} does not fit column {name!r} of dtype"
                        f" {values.dtype}"
                    )
                values = np.where(missing, fill, values)
            if self.add_binary_columns:
                updates[f"{name}_filled"] = Column(missing)
            updates[name] = Column(values)
        return batch.with_columns(updates)


class LogKernel:
    """``log(1 + x)`` in float32; returns every input column, the selected ones replaced."""

    def __init__(self, op: LogOp, selection: ColumnSelector):
        self.names = list(selection.names)
        self.dtype = np.dtype(op.output_dtype)

    def __call__(self, batch: Batch) -> Batch:
        updates = {}
        for name in self.names:
            column = batch[name]
            with np.errstate(all="ignore"):
                values = np.log(_numeric(name, column).astype(self.dtype) + 1)
            updates[name] = _rebuilt(column, values)
        return batch.with_columns(updates)


class NormalizeKernel:
    """``(x - mean) / std`` (or ``x - mean`` when std is 0); returns only the selected columns."""

    def __init__(self, op: Normalize, selection: ColumnSelector):
        self.names = list(selection.names)
        self.dtype = np.dtype(op.output_dtype)
        missing = [name for name in self.names if name not in op.means or name not in op.stds]
        if missing:
            raise NotCompiled(f"no fitted mean/std for {missing!r}")
        self.means = {name: op.means[name] for name in self.names}
        self.stds = {name: op.stds[name] for name in self.names}

    def __call__(self, batch: Batch) -> Batch:
        output = {}
        for name in self.names:
            column = batch[name]
            values = _numeric(name, column)
            with np.errstate(all="ignore"):
                if self.stds[name] > 0:
                    values = (values - self.means[name]) / self.stds[name]
                else:
                    values = values - self.means[name]
            output[name] = _rebuilt(column, values.astype(self.dtype))
        return Batch.of(output)


class NormalizeMinMaxKernel:
    """``(x - min) / (max - min)``, or ``x / 2x`` when max equals min; only the selected columns."""

    def __init__(self, op: NormalizeMinMax, selection: ColumnSelector):
        self.names = list(selection.names)
        self.dtype = np.dtype(op.output_dtype)
        for name in self.names:
            if name not in op.mins or not (op.maxs[name] - op.mins[name] >= 0):
                raise NotCompiled(f"no usable fitted min/max for {name!r}")
        self.mins = {name: op.mins[name] for name in self.names}
        self.maxs = {name: op.maxs[name] for name in self.names}

    def __call__(self, batch: Batch) -> Batch:
        output = {}
        for name in self.names:
            column = batch[name]
            if column.is_list:
                raise Delegate(f"NormalizeMinMax of the list column {name!r}")
            values = _numeric(name, column)
            spread = self.maxs[name] - self.mins[name]
            with np.errstate(all="ignore"):
                if spread > 0:
                    values = (values - self.mins[name]) / spread
                else:
                    values = values / (2 * values)
            output[name] = Column(values.astype(self.dtype))
        return Batch.of(output)
