"""Conversions between pandas DataFrames (one row per record, list cells for list columns) and
``TensorTable``s (values/offsets for ragged lists, 2-D arrays for fixed-length lists).

With a schema, ``frame_to_table`` is strict: exactly the schema's columns must be there, with
its shape, and its dtype or one that converts to it without changing a value (bools are not
numbers, floats with a fraction are not ints); anything else is an ``InputError`` naming the
column. A list column may hold empty lists, and a request may have no rows.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import InputError, MissingColumnsError


def table_to_frame(table: TensorTable, names: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One DataFrame column per table column, renamed through ``names``.

    List columns hold one numpy array per row.
    """
    return columns_to_frame(wire.table_columns(table), names)


def columns_to_frame(
    columns: Mapping[str, wire.TableColumn],
    names: Mapping[str, str] | None = None,
    *,
    labels: pd.Index | None = None,
) -> pd.DataFrame:
    """A DataFrame of table columns (arrays, or a ragged list's ``(values, offsets)``), renamed
    through ``names`` (or labelled ``labels``, an Index a caller keeps for frames of the same
    columns): a ragged or fixed-length list column holds one numpy array per row. It equals
    ``pd.DataFrame(dict)`` of the same cells, whichever way it is built (``PANDAS_INTERNALS``)."""
    cells = cells_per_row(columns)
    if labels is None:
        labels = pd.Index([names.get(name, name) for name in cells] if names else list(cells))
    arrays = list(cells.values())
    rows = len(arrays[0]) if arrays else 0
    if PANDAS_INTERNALS and all(array.dtype in _BLOCK_DTYPES for array in arrays):
        try:
            return _frame_of_blocks(arrays, labels, rows)
        except (ImportError, AttributeError, TypeError):  # internals moved: the public way
            pass
    frame = pd.DataFrame(dict(enumerate(arrays)), index=pd.RangeIndex(rows))
    frame.columns = labels  # set after: labels may repeat, which a dict cannot hold
    return frame


def _pandas_internals() -> bool:
    """Whether ``_frame_of_blocks`` and ``frame_columns`` may use pandas' internals: pandas 1.x
    (the Merlin stack pins it below 2), whose block layout they reproduce, with its internals where
    they were. Any other pandas gets its public constructors, slower and the same."""
    if not pd.__version__.startswith("1."):
        return False
    try:
        _internals()
    except ImportError:
        return False
    return callable(getattr(pd.DataFrame, "_get_column_array", None))


@functools.cache
def _internals() -> tuple:
    """The pandas internals ``_frame_of_blocks`` builds with (pandas-stubs leave them out),
    imported once."""
    from pandas._libs.internals import BlockPlacement  # type: ignore[import-not-found]
    from pandas.core.internals import BlockManager  # type: ignore[import-not-found]
    from pandas.core.internals.blocks import get_block_type  # type: ignore[import-not-found]

    return BlockPlacement, BlockManager, get_block_type


#: whether answers and requests are turned into and out of DataFrames through pandas' private
#: internals (see ``_pandas_internals``), where pandas' public ways spend most of a one-session
#: request's client time
PANDAS_INTERNALS = _pandas_internals()

#: dtypes a pandas block holds as the numpy array it is given (no extension type, no unit)
_BLOCK_DTYPES = frozenset(
    np.dtype(name)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
    + ("uint64", "float32", "float64", "object")
)


@functools.lru_cache(maxsize=256)
def _block_layout(dtypes: tuple[np.dtype, ...]) -> tuple[tuple[type, np.dtype, tuple, Any], ...]:
    """pandas 1.x's blocks for columns of ``dtypes``: per dtype in order of first appearance,
    the block class, the dtype, the columns' positions and their ``BlockPlacement`` (which
    pandas never changes in place, so frames of the same dtypes share them)."""
    block_placement, _, get_block_type = _internals()
    positions: dict[np.dtype, list[int]] = {}
    for position, dtype in enumerate(dtypes):
        positions.setdefault(dtype, []).append(position)
    return tuple(
        (
            get_block_type(dtype),
            dtype,
            tuple(placed),
            block_placement(np.array(placed, dtype=np.intp)),
        )
        for dtype, placed in positions.items()
    )


def _frame_of_blocks(arrays: list[np.ndarray], labels: pd.Index, rows: int) -> pd.DataFrame:
    """The DataFrame ``DataFrame(dict)`` builds, made as pandas lays it out: one 2-D block per
    dtype holding copies of that dtype's columns. For a one-session answer, pandas' own
    constructors spend three times as long finding that layout (which dtypes, which blocks) as
    everything else the client does with the answer, so the layout is worked out once per
    sequence of dtypes (``_block_layout``); it is pandas 1.x's, and ``columns_to_frame`` takes it
    only there (``PANDAS_INTERNALS``) and for plain numpy dtypes."""
    _, block_manager, _ = _internals()
    blocks = []
    for block_type, dtype, placed, placement in _block_layout(tuple(a.dtype for a in arrays)):
        values = np.empty((len(placed), rows), dtype=dtype)
        for row, position in enumerate(placed):
            values[row] = arrays[position]
        blocks.append(block_type(values, ndim=2, placement=placement))
    index = pd.RangeIndex._simple_new(range(rows))  # type: ignore[attr-defined]
    return pd.DataFrame(block_manager(tuple(blocks), [labels, index], verify_integrity=False))


def frame_columns(frame: pd.DataFrame) -> dict:
    """A DataFrame's columns by name, each as the array pandas holds (numpy, or an extension
    array), without the Series that ``frame[name]`` builds for each: for a one-session request
    those cost more than the rest of the request's checks and conversions together. Without
    ``PANDAS_INTERNALS``, the Series (which the checks take as well)."""
    if not PANDAS_INTERNALS:
        return {name: frame.iloc[:, i] for i, name in enumerate(frame.columns)}
    return {
        name: frame._get_column_array(i)  # type: ignore[operator]
        for i, name in enumerate(frame.columns)
    }


def cells_per_row(columns: Mapping[str, wire.TableColumn]) -> dict[str, np.ndarray]:
    """Each column as one entry per row: a 1-D array as it is, a ragged or fixed-length list
    column as an object array holding each row's numpy array."""
    data = {}
    for name, column in columns.items():
        if isinstance(column, tuple):
            values, offsets = np.asarray(column[0]), np.asarray(column[1])
            data[name] = _object_column(np.split(values, offsets[1:-1]) if len(offsets) > 1 else [])
            continue
        values = np.asarray(column)
        data[name] = _object_column(list(values)) if values.ndim > 1 else values
    return data


def frame_to_table(
    data: pd.DataFrame | Mapping[str, object], schema: Schema | None = None
) -> TensorTable:
    """A table from a DataFrame or a dict of columns; list cells become ragged columns.

    Without a schema every column is taken as it is; with one, exactly the schema's columns are
    taken, checked and converted to its dtypes.
    """
    columns: dict[Any, object] = dict(data.items())
    if schema is None:
        converted = {}
        for name, column in columns.items():
            values = column.to_numpy() if isinstance(column, pd.Series) else column
            converted[name] = (
                ragged_from_lists(values) if is_list_column(values) else np.asarray(values)
            )
        return TensorTable(converted, _unsafe=True)
    return TensorTable(checked_columns(columns, schema), _unsafe=True)


def checked_columns(
    columns: Mapping[str, object],
    schema: Schema,
    ready: Mapping[str, np.ndarray] | None = None,
) -> dict[str, wire.TableColumn]:
    """Exactly the schema's columns of ``columns`` (name -> Series, array or list), checked and
    converted to its dtypes and shapes, in schema order (see ``frame_to_table``). ``ready`` holds
    columns a caller already found to be 1-D arrays of the schema's dtype for a scalar column:
    they are taken as they are."""
    if len(columns) != len(schema) or any(c.name not in columns for c in schema):
        check_columns(list(columns), schema)  # names what is missing or extra
    ready = ready or {}
    typed = {
        c.name: ready[c.name] if c.name in ready else _column_for_schema(columns[c.name], c)
        for c in schema
    }
    row_counts = {
        name: len(value[1]) - 1 if isinstance(value, tuple) else len(value)
        for name, value in typed.items()
    }
    first = next(iter(row_counts), None)
    for name, count in row_counts.items():
        if count != row_counts[first]:
            raise InputError(
                name,
                f"{row_counts[first]} rows, like {first!r}",
                f"{count}",
                "every column needs one entry per row",
            )
    return typed


def check_columns(names: list, schema: Schema) -> None:
    """A ``MissingColumnsError`` naming every input column missing from ``names``, or an
    ``InputError`` naming the first of ``names`` that is no input (a server refuses a request with
    an input it does not declare before any step sees it, without naming it)."""
    missing = [c.name for c in schema if c.name not in names]
    if missing:
        raise MissingColumnsError(
            {name: describe_column(schema[name]) for name in missing}, [str(c) for c in names]
        )
    extra = [name for name in names if name not in schema.column_names]
    if extra:
        raise InputError(
            str(extra[0]),
            f"no such column (the inputs are {', '.join(map(repr, schema.column_names))})",
            "a column of that name",
            "drop it, or select the inputs with data[input_schema.column_names]",
        )


def is_list_column(values) -> bool:
    """Whether a column holds one list (or array) per row rather than one value."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return False
    return any(isinstance(v, (list, tuple, np.ndarray)) for v in values)


def ragged_from_lists(rows) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` from a sequence of per-row lists.

    Empty rows add no values, so they do not change the values' dtype (``np.asarray([])`` is
    float64, which would turn a column of int lists into floats).
    """
    arrays = [np.asarray(row) for row in rows]
    offsets = wire.offsets_from_lengths(np.array([len(a) for a in arrays], dtype=np.int64))
    filled = [a for a in arrays if len(a)]
    values = np.concatenate(filled) if filled else np.zeros(0)
    return values, offsets


def _column_for_schema(column, schema: ColumnSchema):
    values = (
        column.to_numpy()
        if isinstance(column, (pd.Series, pd.api.extensions.ExtensionArray))
        else column
    )
    if not isinstance(values, np.ndarray):
        values = np.asarray(values, dtype=object) if is_list_column(values) else np.asarray(values)
    dims = schema.shape.dims
    if len(values) == 0:
        return _no_rows(schema)
    listed = is_list_column(values) or values.ndim > 1
    if dims is None or len(dims) <= 1:
        if listed:
            raise InputError(
                schema.name, describe_column(schema), "a list per row", "send one value per row"
            )
        return _cast(values, schema)
    if not listed:
        raise InputError(
            schema.name,
            describe_column(schema),
            f"one {values.dtype} value per row",
            "send a list per row",
        )
    rows = list(values) if values.ndim > 1 else [np.asarray(cell) for cell in values]
    if wire.is_ragged(schema):
        flat, offsets = ragged_from_lists(rows)
        return _cast(flat, schema), offsets
    length = int(dims[1].max)
    lengths = sorted({len(row) for row in rows})
    if lengths and lengths != [length]:
        raise InputError(
            schema.name, describe_column(schema), f"lists of length {', '.join(map(str, lengths))}"
        )
    return _cast(np.stack(rows) if rows else np.zeros((0, length)), schema)


def _cast(values: np.ndarray, schema: ColumnSchema) -> np.ndarray:
    """``values`` as the schema's dtype, if that changes no value (else an InputError)."""
    want = wire.column_numpy_dtype(schema)
    if values.dtype == want or values.size == 0:
        return values.astype(want, copy=False)
    got = values.dtype
    if (got.kind == "b") != (want.kind == "b"):
        # numpy casts True to 1 safely, but a bool where an id is expected is a mistake
        raise InputError(
            schema.name, describe_column(schema), f"{got} values", f"send {want} values"
        )
    if want.kind in "iub" and got.kind in "fO" and pd.isna(values).any():
        raise InputError(
            schema.name, describe_column(schema), "missing (null) values", "fill or drop them first"
        )
    if want == np.dtype(object):
        if got.kind in "USO":
            return values.astype(object)
    elif got == np.dtype(object) or np.can_cast(got, want, casting="safe"):
        try:
            converted = values.astype(want)
        except (TypeError, ValueError):
            converted = None
        if converted is not None and (got != np.dtype(object) or _same_values(converted, values)):
            return converted
    elif got.kind in "iub" and want.kind in "iu" and _same_values(values.astype(want), values):
        return values.astype(want)  # e.g. int64 ids that fit the schema's int32
    elif got.kind == "f" and want.kind == "f":
        return values.astype(want)
    elif got.kind == "f" and want.kind in "iu" and _integral(values, want):
        return values.astype(want)  # e.g. ids a CSV reader or a join made float64: 8382491.0
    kind = "str" if got.kind in "US" else got
    raise InputError(
        schema.name,
        describe_column(schema),
        f"{kind} values",
        f"they do not convert to {want} without changing",
    )


def _no_rows(schema: ColumnSchema):
    """A column of the schema's dtype and shape with no rows."""
    values = np.zeros(0, dtype=wire.column_numpy_dtype(schema))
    if wire.is_ragged(schema):
        return values, np.zeros(1, dtype=wire.OFFSETS_DTYPE)
    dims = schema.shape.dims
    if dims is not None and len(dims) > 1:
        return values.reshape((0, *(int(d.max) for d in dims[1:])))
    return values


def _integral(values: np.ndarray, want: np.dtype) -> bool:
    """Whether float ``values`` are whole numbers inside ``want``'s range.

    If they are, casting keeps them.
    """
    limits = np.iinfo(want)
    with np.errstate(invalid="ignore"):
        return bool(
            np.isfinite(values).all()
            and (values >= limits.min).all()
            and (values <= limits.max).all()
            and (np.floor(values) == values).all()
        )


def _same_values(converted: np.ndarray, original: np.ndarray) -> bool:
    try:
        return bool(np.array_equal(converted.astype(object), original.astype(object)))
    except (TypeError, ValueError):
        return False


def _object_column(rows: list) -> np.ndarray:
    column = np.empty(len(rows), dtype=object)
    column[:] = rows
    return column
