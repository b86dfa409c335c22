"""An ensemble's answer table as an Arrow table for parquet: the columns, names and order a server
answers (``Client.infer``), list columns as Arrow lists, read back by pandas as the same arrays."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire


def arrow_answer(
    table: TensorTable, schema: Schema, renamed: Mapping[str, str] | None = None
) -> pa.Table:
    """``table`` (an answer of ``schema``) as Arrow columns in schema order, each under its own
    name or the one ``renamed`` gives it."""
    columns = []
    for column in schema:
        data = table[column.name]
        values = np.asarray(data.values)
        if data.offsets is not None:
            columns.append(_lists(values, np.asarray(data.offsets), column))
        elif values.ndim > 1:
            width = int(np.prod(values.shape[1:]))
            offsets = np.arange(len(values) + 1, dtype=np.int64) * width
            columns.append(_lists(values.reshape(-1), offsets, column))
        else:
            columns.append(pa.array(values, type=arrow_type(column)))
    return pa.Table.from_arrays(columns, schema=arrow_schema(schema, renamed))


def empty_answer(schema: Schema, renamed: Mapping[str, str] | None = None) -> pa.Table:
    """An answer without rows, with the columns of ``schema``."""
    return arrow_schema(schema, renamed).empty_table()


def arrow_schema(schema: Schema, renamed: Mapping[str, str] | None = None) -> pa.Schema:
    names = renamed or {}
    return pa.schema(
        [pa.field(names.get(column.name, column.name), _column_type(column)) for column in schema]
    )


def arrow_type(column: ColumnSchema) -> pa.DataType:
    """The Arrow type of one value of ``column``."""
    dtype = wire.column_numpy_dtype(column)
    return pa.string() if dtype == np.dtype(object) else pa.from_numpy_dtype(dtype)


def _column_type(column: ColumnSchema) -> pa.DataType:
    dims = column.shape.dims
    listed = dims is not None and len(dims) > 1
    return pa.list_(arrow_type(column)) if listed else arrow_type(column)


def _lists(values: np.ndarray, offsets: np.ndarray, column: ColumnSchema) -> pa.Array:
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32, copy=False)), pa.array(values, type=arrow_type(column))
    )
