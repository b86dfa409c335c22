"""Small valid inputs built from a schema: ids inside each column's domain, lists of legal length.

Used to trace models, to warm Triton models up at load, and to check an exported model the way
the server will call it.
"""

from __future__ import annotations

import numpy as np
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError


def sample_values(column: ColumnSchema, count: int, seed: int = 0) -> np.ndarray:
    """``count`` values a column may legally hold (deterministic for a seed)."""
    dtype = wire.column_numpy_dtype(column)
    rng = np.random.default_rng(seed)
    if dtype == np.dtype(object):
        return np.array([f"sample-{i}".encode() for i in range(count)], dtype=object)
    if dtype.kind == "f":
        return rng.random(count).astype(dtype)
    if dtype.kind == "b":
        return np.zeros(count, dtype=dtype)
    domain = column.properties.get("domain") or {}
    # 0 is padding for categorical columns; start above it when the domain allows
    low = max(int(domain.get("min") or 0), 1)
    declared_max = domain.get("max")
    high = max(low if declared_max is None else int(declared_max), low)
    return rng.integers(low, high + 1, count).astype(dtype)


def list_length(column: ColumnSchema) -> int | None:
    """Fixed length of a list column, its maximum for ragged lists, None for scalars."""
    dims = column.shape.dims
    if dims is None or len(dims) < 2:
        return None
    return None if dims[1].max is None else int(dims[1].max)


def padded_length(column: ColumnSchema) -> int:
    """The length ragged list ``column`` is padded to for a model: its maximum, which it needs."""
    length = list_length(column)
    if length is None:
        raise SchemaError(
            "PredictPytorch",
            column.name,
            "a ragged list with a maximum length (value_count.max) to pad to",
            f"{describe_column(column)} without one",
            "pass max_sequence_length=...",
        )
    return length


def sample_table(schema: Schema, rows: int = 1, ragged_length: int = 2) -> TensorTable:
    """A table of ``rows`` rows; ragged lists hold ``ragged_length`` items (capped at their max)."""
    columns: dict[str, wire.TableColumn] = {}
    for i, column in enumerate(schema):
        if wire.is_ragged(column):
            length = min(ragged_length, list_length(column) or ragged_length)
            values = sample_values(column, rows * length, seed=i)
            columns[column.name] = (values, wire.offsets_from_lengths(np.full(rows, length)))
            continue
        dims = [rows] + [int(d.max) for d in (column.shape.dims or ())[1:]]
        values = sample_values(column, int(np.prod(dims)), seed=i)
        columns[column.name] = values.reshape(dims)
    return TensorTable(columns, _unsafe=True)
