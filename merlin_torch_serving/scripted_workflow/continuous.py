"""Scripted ``FillMissing``, ``Normalize`` and ``NormalizeMinMax``: the arithmetic pandas runs, in
the dtypes numpy picks for it (the counterparts of ``fastpath.continuous``).

numpy decides the dtype of ``array - scalar`` by the scalar's value (numpy 1.x): a float32 column
minus a float64 mean stays float32. Each kernel asks numpy once, at export, which dtype every step
takes, casts to it, and runs the same IEEE operation in torch, so the bits agree. ``LogOp`` has no
scripted form: numpy's float32 ``log`` (its own SIMD code) differs from torch's in the last bits
of about 4 % of values (measured here), so it stays with the python step.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import numpy as np
import torch
from merlin.dag import ColumnSelector
from nvtabular.ops import FillMissing, LogOp, Normalize, NormalizeMinMax

from merlin_torch_serving.fastpath.continuous import (
    FillMissingKernel,
    NormalizeKernel,
    NormalizeMinMaxKernel,
)
from merlin_torch_serving.fastpath.errors import NotCompiled
from merlin_torch_serving.scripted_workflow.columns import ColumnType, torch_dtype


class FillMissingScript(torch.nn.Module):
    """NaN replaced by the fill value in float columns; with ``add_binary_columns`` a
    ``<name>_filled`` column, True where a value was missing; every input column returned."""

    names: list[str]
    floats: list[str]
    fill_value: float
    add_binary_columns: bool

    def __init__(self, names, floats, fill_value, add_binary_columns):
        super().__init__()
        self.names = list(names)
        self.floats = list(floats)
        self.fill_value = float(fill_value)
        self.add_binary_columns = add_binary_columns

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        filled = dict(values)
        for name in self.names:
            column = values[name]
            missing = torch.zeros(column.shape, dtype=torch.bool)
            if name in self.floats:
                missing = torch.isnan(column)
                column = torch.where(missing, torch.full_like(column, self.fill_value), column)
            if self.add_binary_columns:
                filled[name + "_filled"] = missing
            filled[name] = column
        return filled, offsets, rows


class AffineScript(torch.nn.Module):
    """Per column ``x - shift`` (mode 0), ``(x - shift) / scale`` (mode 1) or ``x / (2 * x)`` (mode
    2, NormalizeMinMax of a constant column), each step in the dtype numpy gives it (``shifts`` and
    ``scales`` are 0-dim tensors in those dtypes, as numpy casts the scalars); returns only those
    columns."""

    names: list[str]
    modes: dict[str, int]
    shifts: dict[str, torch.Tensor]
    scales: dict[str, torch.Tensor]
    doubled_dtypes: dict[str, torch.dtype]
    out_dtype: torch.dtype

    def __init__(self, names, modes, shifts, scales, doubled, out_dtype):
        super().__init__()
        self.names = list(names)
        self.modes = modes
        self.shifts = shifts
        self.scales = scales
        self.doubled_dtypes = doubled
        self.out_dtype = out_dtype

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        output: dict[str, torch.Tensor] = {}
        output_offsets: dict[str, torch.Tensor] = {}
        for name in self.names:
            column = values[name]
            scale = self.scales[name]
            if self.modes[name] == 2:
                doubled = 2 * column.to(self.doubled_dtypes[name])
                column = column.to(scale.dtype) / doubled.to(scale.dtype)
            else:
                shift = self.shifts[name]
                column = column.to(shift.dtype) - shift
                if self.modes[name] == 1:
                    column = column.to(scale.dtype) / scale
            output[name] = column.to(self.out_dtype)
            if name in offsets:
                output_offsets[name] = offsets[name]
        return output, output_offsets, rows


def build_fill_missing(op: FillMissing, selection: ColumnSelector, types: dict[str, ColumnType]):
    kernel = FillMissingKernel(op, selection)
    output, floats = dict(types), []
    for name in kernel.names:
        column = types[name]
        if column.is_list or column.dtype.kind not in "iufb":
            raise NotCompiled(f"FillMissing of the {column.describe()} column {name!r}")
        if column.is_float:
            if column.dtype.type(kernel.fill_value) != kernel.fill_value:
                raise NotCompiled(
                    f"fill value {kernel.fill_value!r} does not fit column {name!r} of dtype"
                    f" {column.dtype}; pandas then moves it to float64"
                )
            floats.append(name)
        if kernel.add_binary_columns:
            output[f"{name}_filled"] = ColumnType(np.dtype(np.bool_))
    module = FillMissingScript(kernel.names, floats, kernel.fill_value, kernel.add_binary_columns)
    return module, output


def build_log(op: LogOp, selection: ColumnSelector, types: dict[str, ColumnType]):
    raise NotCompiled(
        "numpy's float32 log (its own SIMD code) and torch's differ in the last bits of about 4 %"
        " of values, so only the python step gives NVTabular's answer"
    )


def build_normalize(op: Normalize, selection: ColumnSelector, types: dict[str, ColumnType]):
    kernel = NormalizeKernel(op, selection)
    return _affine(kernel.names, kernel.means, kernel.stds, kernel.dtype, types, minmax=False)


def build_normalize_minmax(
    op: NormalizeMinMax, selection: ColumnSelector, types: dict[str, ColumnType]
):
    kernel = NormalizeMinMaxKernel(op, selection)
    spreads = {name: kernel.maxs[name] - kernel.mins[name] for name in kernel.names}
    return _affine(kernel.names, kernel.mins, spreads, kernel.dtype, types, minmax=True)


def _affine(names, shifts, scales, out_dtype, types, minmax: bool):
    modes, shift_tensors, scale_tensors, doubled, output = {}, {}, {}, {}, {}
    for name in names:
        column = types[name]
        if column.dtype.kind not in "iuf" or (minmax and column.is_list):
            raise NotCompiled(f"{'NormalizeMinMax' if minmax else 'Normalize'} of {name!r}")
        ones = np.ones(1, dtype=column.dtype)
        with np.errstate(all="ignore"):
            shifted = ones - shifts[name]
            doubled_dtype = (2 * ones).dtype
            if minmax and not scales[name] > 0:
                modes[name], scaled_dtype = 2, (ones / (2 * ones)).dtype
            else:
                modes[name] = 1 if scales[name] > 0 else 0
                scaled_dtype = (shifted / scales[name]).dtype
        # numpy casts a scalar operand to the dtype of the operation: so do these 0-dim tensors
        shift_tensors[name] = torch.tensor(
            np.asarray(shifts[name]).astype(shifted.dtype).item(),
            dtype=torch_dtype(shifted.dtype, f"{name!r} minus its shift"),
        )
        scale_tensors[name] = torch.tensor(
            np.asarray(scales[name]).astype(scaled_dtype).item(),
            dtype=torch_dtype(scaled_dtype, f"{name!r} over its scale"),
        )
        doubled[name] = torch_dtype(doubled_dtype, f"twice {name!r}")
        output[name] = ColumnType(np.dtype(out_dtype), column.is_list)
    module = AffineScript(
        names,
        modes,
        shift_tensors,
        scale_tensors,
        doubled,
        torch_dtype(np.dtype(out_dtype), "the normalized output"),
    )
    return module, output
