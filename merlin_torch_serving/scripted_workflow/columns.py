"""What the scripted workflow knows about each column before any request arrives.

Kernels are built for the dtypes and kinds of their input columns, which follow from the workflow's
input schema (Triton and the ensemble's entry check hold requests to it): the dtype pandas would
give the column, whether it is a list, and how pandas holds a list's rows (Groupby makes python
lists, which ``ListSlice(pad=True)`` pads; Categorify and raw inputs make numpy arrays, which it
does not). Knowing them at export lets every dtype decision NVTabular makes per request be made
once, here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from merlin_torch_serving.fastpath.batch import ARRAY_CELLS, LIST_CELLS
from merlin_torch_serving.fastpath.errors import NotCompiled

__all__ = ["ARRAY_CELLS", "LIST_CELLS", "ColumnType", "torch_dtype"]

_TORCH_DTYPES = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}


def torch_dtype(dtype: np.dtype, what: str) -> torch.dtype:
    """The torch dtype holding numpy's ``dtype`` exactly; NotCompiled naming ``what`` if none."""
    try:
        return _TORCH_DTYPES[np.dtype(dtype)]
    except KeyError:
        pass
    if np.dtype(dtype) in (np.dtype("datetime64[ns]"), np.dtype("timedelta64[ns]")):
        return torch.int64  # nanoseconds, as pandas holds them
    if np.dtype(dtype).kind in "OUS":
        raise NotCompiled(
            f"{what} holds strings, which Triton's pytorch backend hands TorchScript only as"
            " List[str] arguments of forward, never in the Dict[str, Tensor] a step takes"
        )
    raise NotCompiled(f"{what} has dtype {np.dtype(dtype)}, which torch does not hold")


@dataclass(frozen=True)
class ColumnType:
    """A column as a kernel receives it: its values' numpy dtype, list or scalar, the kind of list
    cells (``LIST_CELLS`` or ``ARRAY_CELLS``) and, when known, the smallest and largest value.
    ``varying``: pandas gives the column ``dtype`` only in some requests (ListSlice's float padding
    of integer lists happens only when a row is short), so only passing it on is exact."""

    dtype: np.dtype
    is_list: bool = False
    cells: str = ARRAY_CELLS
    value_range: tuple[int, int] | None = None
    varying: bool = False

    def with_dtype(self, dtype) -> ColumnType:
        return replace(self, dtype=np.dtype(dtype), value_range=None)

    def scalar(self) -> ColumnType:
        return ColumnType(self.dtype, value_range=self.value_range)

    def of_lists(self, cells: str) -> ColumnType:
        return ColumnType(self.dtype, True, cells, self.value_range)

    @property
    def is_float(self) -> bool:
        return self.dtype.kind == "f"

    def describe(self) -> str:
        kind = f"list ({self.cells} cells)" if self.is_list else "scalar"
        return f"{kind} of {self.dtype}"


Types = dict[str, ColumnType]


def python_scalar_dtype(dtype: np.dtype, what: str) -> np.dtype:
    """The dtype pandas infers for values that passed through python lists (``as_python_scalars``):
    integers become int64, floats float64; booleans stay."""
    if dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize < 8):
        return np.dtype(np.int64)
    if dtype.kind == "f":
        return np.dtype(np.float64)
    if dtype.kind in "bmM":  # pandas reads Timestamps and Timedeltas back as datetime64
        return dtype
    raise NotCompiled(f"{what} of dtype {dtype} in python lists")
