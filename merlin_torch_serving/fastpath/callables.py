"""Compiled ``LambdaOp``/``UDF`` and ``Filter``: the user's function called on numpy arrays, or on
the one pandas Series NVTabular would pass it (``pd.to_datetime``, ``.dt.weekday``, ``col.min()``).

Compiled only where it gives exactly NVTabular's result on probe data built from the input schema;
at run time any surprise (an exception, a wrong shape) sends that call to NVTabular instead. A
function of the whole column (``col - col.min()``) sees the request's rows, as it does in NVTabular.
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
from merlin.dag import ColumnSelector, Node
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.batch import (
    LIST_CELLS,
    OFFSETS_DTYPE,
    Batch,
    Column,
    as_python_scalars,
    same_values,
)
from merlin_torch_serving.fastpath.errors import Delegate, NotCompiled
from merlin_torch_serving.fastpath.fallback import NVTabularStep
from merlin_torch_serving.fastpath.kernel import Kernel

_PROBE_INTEGERS = [0, 1, -1, 2, 3, 7, -8, 10, 42, 100, -100, 1000, 65535, -32768, 123456789, 5]
_PROBE_FLOATS = [
    0.0,
    1.0,
    -1.0,
    0.5,
    -2.25,
    3.75,
    10.0,
    1e-3,
    1e6,
    -1e6,
    np.nan,
    np.inf,
    -np.inf,
    42.0,
    -0.0,
    7.5,
]
_PROBE_STRINGS = [
    "a",
    "b",
    "",
    "abc",
    "Z",
    "hello world",
    "a",
    "0",
    "-1",
    "é",
    "b",
    "xyz",
    "A",
    " ",
    "long" * 5,
    "q",
]


def udf_kernel(node: Node, selection: ColumnSelector) -> Kernel:
    """The function called on numpy arrays where that is exact, else on pandas Series."""
    if len(inspect.signature(node.op.f).parameters) != 1:
        raise NotCompiled("the function takes the whole DataFrame as a second argument")
    if node.op.dependencies:
        raise NotCompiled("the operator has dependencies")
    try:
        return UDFKernel(node, selection)
    except NotCompiled as on_arrays:
        try:
            return SeriesUDFKernel(node, selection)
        except NotCompiled as on_series:
            raise NotCompiled(f"{on_arrays.reason}; on pandas Series {on_series.reason}") from None


class UDFKernel:
    """A one-argument UDF applied to each selected column's values; returns only those columns."""

    def __init__(self, node: Node, selection: ColumnSelector):
        self.f = node.op.f
        self.names = list(selection.names)
        _check_on_probe(self, node, selection)

    def __call__(self, batch: Batch) -> Batch:
        output = {}
        for name in self.names:
            output[name] = Column(_call(self.f, self._argument(name, batch[name]), batch.num_rows))
        return Batch.of(output)

    def _argument(self, name: str, column: Column):
        if column.is_list:
            raise Delegate(f"a function of the list column {name!r}")
        return column.values.copy()


class SeriesUDFKernel(UDFKernel):
    """The UDF called on the column as the pandas Series NVTabular passes it.

    No DataFrame is built.
    """

    def _argument(self, name: str, column: Column):
        if column.is_list:
            raise Delegate(f"a function of the list column {name!r}")
        return pd.Series(column.values.copy(), name=name)


class FilterKernel:
    """Keeps the rows where ``f(columns)`` is true; ``f`` sees numpy arrays by column name."""

    def __init__(self, node: Node, selection: ColumnSelector):
        self.f = node.op.f
        _check_on_probe(self, node, selection)

    def __call__(self, batch: Batch) -> Batch:
        keep = _call(self.f, ArrayColumns(batch), batch.num_rows)
        if keep.dtype != np.bool_:
            raise Delegate(f"the filter returned {keep.dtype} values, not booleans")
        return batch.take(np.flatnonzero(keep))


class ArrayColumns:
    """What a filter receives instead of a DataFrame: ``cols["a"]`` and ``cols.a`` give arrays."""

    def __init__(self, batch: Batch):
        self._batch = batch

    def __getitem__(self, name: str) -> np.ndarray:
        if not isinstance(name, str):
            raise Delegate(f"the function indexed the columns with {type(name).__name__}")
        column = self._batch[name]
        if column.is_list:
            raise Delegate(f"the function reads the list column {name!r}")
        return column.values.copy()

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _call(f, argument, num_rows: int) -> np.ndarray:
    try:
        result = f(argument)
    except Delegate:
        raise
    except Exception as error:  # the function's own code decides what it supports
        raise Delegate(f"the function raised {type(error).__name__}: {error}") from None
    if isinstance(argument, pd.Series) and isinstance(result, pd.Series):
        # NVTabular puts the result in a DataFrame by index: the rows must stay where they were
        if not result.index.equals(argument.index):
            raise Delegate("the function returned a Series with other row labels")
        result = result.to_numpy()
    if not isinstance(result, np.ndarray) or result.shape != (num_rows,):
        shape = getattr(result, "shape", None)
        raise Delegate(
            f"the function returned {type(result).__name__} of shape {shape}, not one value per row"
        )
    return result


def _check_on_probe(kernel: Kernel, node: Node, selection: ColumnSelector) -> None:
    """Raise NotCompiled unless the kernel and NVTabular agree exactly on every probe batch."""
    nvtabular = NVTabularStep(node, selection)
    for variant, probe in probe_batches(node.input_schema).items():
        try:
            expected = nvtabular(probe)
        except Exception as error:
            raise NotCompiled(
                f"NVTabular fails on probe data ({variant}: {type(error).__name__}: {error})"
            ) from None
        try:
            got = kernel(probe)
        except Delegate as delegated:
            raise NotCompiled(f"on numpy arrays {delegated.reason}") from None
        if set(got.columns) != set(expected.columns) or got.num_rows != expected.num_rows:
            raise NotCompiled(
                f"on numpy arrays it gives columns {sorted(got.columns)} x {got.num_rows} rows, "
                f"NVTabular {sorted(expected.columns)} x {expected.num_rows} rows ({variant})"
            )
        if expected.num_rows == 0:
            continue  # without rows pandas cannot tell list columns from others, nor their dtypes
        for name, column in expected.columns.items():
            ours = got.columns[name]
            same_rows = (
                column.offsets is None
                if ours.offsets is None
                else column.offsets is not None and np.array_equal(ours.offsets, column.offsets)
            )
            # pandas types an empty flattened list column as float64 whatever it held
            no_values = column.is_list and len(column.values) == 0 and len(ours.values) == 0
            if not same_rows or not (no_values or same_values(ours.values, column.values)):
                raise NotCompiled(
                    f"on numpy arrays it gives other values or dtypes for {name!r} than pandas"
                    f" ({variant})"
                )


def probe_batches(schema: Schema) -> dict[str, Batch]:
    """Probe data for every column of the schema, in variants that tell pandas and numpy apart.

    One variant alone can hide a difference (an inf and a -inf make any mean NaN, with or without
    skipping NaN), so the values also come without infinities, without nulls, reversed and alone.
    """
    base = {column.name: _probe_values(column) for column in schema}
    variants = {
        "edge values": lambda values: values,
        "without infinities": lambda values: _replace(values, np.isinf),
        "without nulls or infinities": lambda values: _replace(values, lambda v: ~np.isfinite(v)),
        "reversed": lambda values: values[::-1].copy(),
        "one row": lambda values: values[:1].copy(),
    }
    batches = {}
    for variant, change in variants.items():
        columns = {
            column.name: _probe_column(column, change(base[column.name])) for column in schema
        }
        batches[variant] = Batch.of(columns)
    return batches


def _replace(values: np.ndarray, where) -> np.ndarray:
    if values.dtype.kind != "f":
        return values
    replaced = values.copy()
    mask = where(values)
    replaced[mask] = np.arange(mask.sum()) + 2.5
    return replaced


def _probe_column(column: ColumnSchema, values: np.ndarray) -> Column:
    if not column.is_list:
        return Column(values)
    # rows of 1, 2, 3 and 0 elements, held as python lists like Groupby's output
    row_lengths = (np.arange(len(values)) + 1) % 4
    offsets = wire.offsets_from_lengths(row_lengths, OFFSETS_DTYPE)
    return Column(as_python_scalars(np.resize(values, offsets[-1])), offsets, LIST_CELLS)


def _probe_values(column: ColumnSchema) -> np.ndarray:
    """Sixteen values of the column's dtype, with edge values (zero, negatives, NaN, inf)."""
    if column.dtype.element_type.value == "string":
        return np.array(_PROBE_STRINGS, dtype=object)
    try:
        dtype = np.dtype(column.dtype.to_numpy)
    except Exception:
        raise NotCompiled(f"input {column.name!r} has no numpy dtype in the schema") from None
    if dtype.kind == "O":  # pandas' object columns: strings, as far as a schema can tell
        return np.array(_PROBE_STRINGS, dtype=object)
    if dtype.kind == "b":
        return np.arange(len(_PROBE_INTEGERS)) % 3 == 0
    if dtype.kind in "mM":
        # seconds around 1970 and in recent years, one NaT; in the schema's unit
        seconds = np.array(_PROBE_INTEGERS, dtype=np.int64) + 1_400_000_000 * (
            np.arange(len(_PROBE_INTEGERS)) % 2
        )
        values = seconds.astype("m8[s]" if dtype.kind == "m" else "M8[s]").astype(dtype)
        values[3] = np.array("NaT", dtype=dtype)
        return values
    if dtype.kind == "f":
        return np.array(_PROBE_FLOATS, dtype=dtype)
    if dtype.kind in "iu":
        integers = np.array(_PROBE_INTEGERS, dtype=np.int64)
        if dtype.kind == "u":
            integers = np.abs(integers)
        return integers.astype(dtype)
    raise NotCompiled(f"input {column.name!r} has dtype {dtype}, which has no probe data")
