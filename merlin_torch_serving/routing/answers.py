"""The branches' answers put back together: one row per session of the route's input, each from
the branch that answered it, blank (as ``ops.filtered`` blanks) where none did."""

from __future__ import annotations

import numpy as np
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import MerlinTorchServingError, SchemaError
from merlin_torch_serving.ops.filtered import blank_value


def common_schema(route: str, schemas: dict[str, Schema]) -> Schema:
    """The output schema shared by every branch (the first branch's), or a ``SchemaError`` naming
    the branch and the column that differ: branches must return the same columns, with the same
    dtypes and shapes, scalars or fixed-length lists, and ids in the same form (encoded ids carry
    their catalog's domain; ``DecodeItemIds`` drops it)."""
    (first, expected), *others = schemas.items()
    for column in expected:
        if wire.is_ragged(column):
            raise SchemaError(
                route,
                column.name,
                f"scalars or fixed-length lists from branch {first!r}",
                describe_column(column),
                "a route merges rows of fixed shape; pad the list to a fixed length first",
            )
    for name, schema in others:
        if schema.column_names != expected.column_names:
            raise SchemaError(
                route,
                None,
                f"branch {name!r} to return the columns of branch {first!r}"
                f" ({', '.join(map(repr, expected.column_names))})",
                ", ".join(map(repr, schema.column_names)) or "no columns",
            )
        for want in expected:
            got = schema[want.name]
            if describe_column(got) != describe_column(want):
                raise SchemaError(
                    route,
                    want.name,
                    f"{describe_column(want)} from branch {name!r}, as branch {first!r} returns",
                    describe_column(got),
                )
            if _encoded(got) != _encoded(want):
                encoded, decoded = (name, first) if _encoded(got) else (first, name)
                raise SchemaError(
                    route,
                    want.name,
                    f"ids in one form from every branch (branch {decoded!r} returns raw ids)",
                    f"encoded ids (with a catalog domain) from branch {encoded!r}",
                    f"end branch {encoded!r} with DecodeItemIds too",
                )
    return expected


def merged(schema: Schema, rows: int, answered: list[tuple[np.ndarray, TensorTable]]) -> dict:
    """Columns of ``schema`` with ``rows`` rows: each answer's rows at its positions, the rest
    blank (NaN, -1, False or "")."""
    if len(answered) == 1 and len(answered[0][0]) == rows:  # one branch answered every session
        positions, answer = answered[0]
        if (positions == np.arange(rows)).all():
            return {column.name: answer[column.name].values for column in schema}
    columns = {}
    for column in schema:
        dtype = wire.column_numpy_dtype(column)
        trailing = _trailing_shape(column, answered)
        values = np.full((rows, *trailing), blank_value(dtype), dtype=dtype)
        for positions, answer in answered:
            values[positions] = np.asarray(answer[column.name].values).reshape(
                len(positions), *trailing
            )
        columns[column.name] = values
    return columns


def error_message(branch: str, error: Exception) -> str:
    """What the sessions of a failed branch carry in the route's error column."""
    detail = (
        str(error)
        if isinstance(error, MerlinTorchServingError)
        else (f"{type(error).__name__}: {error}")
    )
    return f"branch {branch!r} failed: {detail}"


def _trailing_shape(column: ColumnSchema, answered) -> tuple[int, ...]:
    for _, answer in answered:
        return tuple(np.asarray(answer[column.name].values).shape[1:])
    dims = column.shape.dims or ()
    return tuple(int(dim.max or 0) for dim in dims[1:])


def _encoded(column: ColumnSchema) -> bool:
    return "domain" in column.properties and column.dtype.element_type.value == "int"
