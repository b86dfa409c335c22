"""The compiled workflow's edges: request arrays in, wire-format arrays out.

Requests hold one 1-D array per input column (ragged lists as ``<c>__values``/``<c>__offsets``);
results follow ``merlin_torch_serving.data.wire`` for the workflow's output schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data.wire import (
    OFFSETS_DTYPE,
    OFFSETS_SUFFIX,
    VALUES_SUFFIX,
    column_numpy_dtype,
    is_ragged,
)
from merlin_torch_serving.exceptions import InputError
from merlin_torch_serving.fastpath.batch import ARRAY_CELLS, Batch, Column
from merlin_torch_serving.fastpath.errors import FastPathError


def request_batch(columns: Mapping[str, np.ndarray], schema: Schema) -> Batch:
    """The request as a batch of the input schema's columns.

    Strings are object arrays, as in pandas.
    """
    if not isinstance(columns, Mapping):
        raise TypeError(
            f"columns must be a mapping of column name to numpy array, got {type(columns).__name__}"
        )
    batch_columns = {}
    missing = []
    for column in schema:
        name = column.name
        if name in columns:
            batch_columns[name] = Column(_values(name, columns[name]))
        elif name + VALUES_SUFFIX in columns and name + OFFSETS_SUFFIX in columns:
            batch_columns[name] = _ragged(
                name, columns[name + VALUES_SUFFIX], columns[name + OFFSETS_SUFFIX]
            )
        else:
            missing.append(name)
    if missing:
        raise InputError(
            missing[0],
            f"an array (or '{VALUES_SUFFIX}' and '{OFFSETS_SUFFIX}' arrays for a list column)",
            "no such key",
            f"the workflow needs {schema.column_names!r}; missing: {missing!r}; given:"
            f" {sorted(columns)!r}",
        )
    row_counts = {name: column.num_rows for name, column in batch_columns.items()}
    if len(set(row_counts.values())) > 1:
        counts = list(row_counts.values())
        usual = max(set(counts), key=counts.count)
        odd = next(name for name, rows in row_counts.items() if rows != usual)
        like = [name for name, rows in row_counts.items() if rows == usual]
        raise InputError(
            odd,
            f"{usual} rows, like {', '.join(map(repr, like))}",
            f"{row_counts[odd]} rows",
            "every input column needs one value (or one list) per raw row; rows per column:"
            f" {row_counts}",
        )
    return Batch(batch_columns, next(iter(row_counts.values()), 0))


def _values(name: str, array) -> np.ndarray:
    values = np.asarray(array)
    got = None
    if values.ndim != 1:
        got = f"an array of shape {values.shape}"
    elif (
        values.dtype == object and len(values) and isinstance(values[0], (list, tuple, np.ndarray))
    ):
        got = "an object array of lists"
    if got:
        raise InputError(
            name,
            "a 1-D array with one value per row",
            got,
            f"send a list column as {name + VALUES_SUFFIX!r} and {name + OFFSETS_SUFFIX!r}",
        )
    # pandas holds fixed-width strings and bytes as object columns of str / bytes
    return values.astype(object) if values.dtype.kind in "US" else values


def _ragged(name: str, values, offsets) -> Column:
    values = _values(name + VALUES_SUFFIX, values)
    offsets = np.asarray(offsets)
    problem = None
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) == 0:
        problem = f"an array of dtype {offsets.dtype} and shape {offsets.shape}"
    elif offsets[0] != 0 or offsets[-1] != len(values) or np.any(np.diff(offsets) < 0):
        problem = f"offsets from {offsets[0]} to {offsets[-1]} for {len(values)} values"
    if problem:
        raise InputError(
            name + OFFSETS_SUFFIX,
            f"non-decreasing integer offsets from 0 to len({name + VALUES_SUFFIX!r})",
            problem,
        )
    # pandas holds the rows of a ragged input as numpy arrays
    return Column(values, offsets.astype(OFFSETS_DTYPE), ARRAY_CELLS)


@dataclass(frozen=True)
class OutputColumn:
    """How one output column travels: its wire dtype (None: as produced) and kind of tensor."""

    name: str
    dtype: np.dtype | None
    ragged: bool
    width: int | None  # values per row of a fixed-size list; None for scalars and ragged lists


def output_layout(schema: Schema) -> list[OutputColumn]:
    """Read once at compile time what the output schema asks of every column."""
    layout = []
    for column in schema:
        try:
            dtype = column_numpy_dtype(column)
        except TypeError:
            dtype = None
        ragged = is_ragged(column)
        width = _fixed_length(column) if column.is_list and not ragged else None
        layout.append(OutputColumn(column.name, dtype, ragged, width))
    return layout


def wire_arrays(batch: Batch, layout: list[OutputColumn]) -> dict[str, np.ndarray]:
    """The batch's columns in the wire format of the output layout, cast to its dtypes."""
    if batch.num_rows == 0:
        # a step that ran through NVTabular may return no rows, and with them no list columns
        return empty_wire_arrays(layout)
    arrays = {}
    for output in layout:
        name = output.name
        column = batch[name]
        dtype = output.dtype or column.values.dtype
        is_list = output.ragged or output.width is not None
        if is_list != column.is_list:
            want = "a list column" if is_list else "a scalar column"
            raise FastPathError(
                f"output column {name!r} is {want} in the output schema, but the workflow made the"
                " other kind"
            )
        if output.ragged:
            arrays[name + VALUES_SUFFIX] = _cast(name, column.values, dtype)
            arrays[name + OFFSETS_SUFFIX] = column.list_offsets().astype(OFFSETS_DTYPE)
        elif output.width is not None:
            row_lengths = column.lengths()
            if np.any(row_lengths != output.width):
                raise FastPathError(
                    f"output column {name!r} is a list of {output.width} values per row in the"
                    f" output schema, but rows hold {np.unique(row_lengths)[:5].tolist()} values;"
                    " pad the list (ListSlice(pad=True)) or declare the column ragged"
                )
            arrays[name] = _cast(name, column.values, dtype).reshape(column.num_rows, output.width)
        else:
            arrays[name] = _cast(name, column.values, dtype)
    return arrays


def empty_wire_arrays(layout: list[OutputColumn]) -> dict[str, np.ndarray]:
    """The wire format of zero rows for every output column.

    A column whose schema has no dtype is float64.
    """
    arrays = {}
    for output in layout:
        dtype = output.dtype or np.dtype(np.float64)
        if output.ragged:
            arrays[output.name + VALUES_SUFFIX] = np.array([], dtype=dtype)
            arrays[output.name + OFFSETS_SUFFIX] = np.zeros(1, dtype=OFFSETS_DTYPE)
        elif output.width is not None:
            arrays[output.name] = np.zeros((0, output.width), dtype=dtype)
        else:
            arrays[output.name] = np.array([], dtype=dtype)
    return arrays


def _fixed_length(column: ColumnSchema) -> int:
    dims = column.shape.dims
    if dims is None or len(dims) < 2 or not dims[1].is_fixed:
        raise FastPathError(
            f"output column {column.name!r} is a list without a fixed or ragged shape:"
            f" {column.shape}"
        )
    return int(dims[1].max)


def _cast(name: str, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if values.dtype == dtype:
        return values
    if dtype.kind in "iub" and values.dtype.kind == "f" and np.isnan(values).any():
        raise FastPathError(
            f"output column {name!r} holds nulls (NaN), but its schema dtype {dtype} cannot hold"
            " them; fill the nulls in the workflow (e.g. FillMissing) or give the column a float"
            " dtype"
        )
    try:
        return values.astype(dtype)
    except (TypeError, ValueError) as error:
        raise FastPathError(
            f"output column {name!r} holds {values.dtype} values that do not convert to its schema "
            f"dtype {dtype}: {error}"
        ) from None
