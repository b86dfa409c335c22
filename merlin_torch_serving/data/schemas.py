"""Schema helpers shared by graph building, export and the client: a JSON round trip that keeps
tags and properties, the short descriptions of a column's dtype and shape used in errors, and
the catalog a model's id inputs index."""

from __future__ import annotations

import json

from merlin.dtypes.base import ElementType
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

# tensorflow-metadata has no boolean feature type; such columns carry their dtype here
_BOOL_MARK = "merlin_torch_serving_bool"


def schema_to_json(schema: Schema) -> str:
    """The schema as JSON with sorted keys and tags, so one schema always gives the same text."""
    data = json.loads(TensorflowMetadata.from_merlin_schema(schema).to_json())
    for feature, column in zip(data.get("feature", []), schema, strict=True):
        annotation = feature.setdefault("annotation", {})
        if "tag" in annotation:  # tags come from a set
            annotation["tag"] = sorted(annotation["tag"])
        if column.dtype.element_type.value == "bool":
            annotation.setdefault("extraMetadata", [{}])[0][_BOOL_MARK] = True
        # merlin writes no type for string (or object) columns, though it reads BYTES back as
        # strings; without it they would come back with an unknown dtype
        if column.dtype.element_type in (ElementType.String, ElementType.Object):
            feature["type"] = "BYTES"
    return json.dumps(data, sort_keys=True)


def schema_from_json(text: str) -> Schema:
    schema = TensorflowMetadata.from_json(text).to_merlin_schema()
    columns = []
    for column in schema:
        if column.properties.get(_BOOL_MARK):
            properties = {k: v for k, v in column.properties.items() if k != _BOOL_MARK}
            column = ColumnSchema(
                column.name,
                tags=column.tags,
                properties=properties,
                dtype="bool",
                dims=column.shape.dims,
            )
        columns.append(column)
    return Schema(columns)


def describe_column(column: ColumnSchema) -> str:
    """``int64 ragged list``, ``float32 fixed list [-1, 33]``, ``int64 scalar``."""
    shape = column.shape
    if shape.dims is None or len(shape.dims) <= 1:
        kind = "scalar"
    elif shape.is_ragged:
        kind = "ragged list"
    else:
        kind = (
            "fixed list ["
            + ", ".join(
                "-1" if i == 0 or not d.is_fixed else str(d.max) for i, d in enumerate(shape.dims)
            )
            + "]"
        )
    return f"{column.dtype.without_shape.name} {kind}"


def catalog_limits(schema: Schema) -> dict[str, int]:
    """``column -> largest id`` of the categorical int columns whose domain is known (the rows of
    the embedding table a model looks them up in)."""
    limits = {}
    for column in schema:
        domain = column.properties.get("domain") or {}
        if (
            Tags.CATEGORICAL in column.tags
            and column.dtype.element_type.value == "int"
            and domain.get("max") is not None
        ):
            limits[column.name] = int(domain["max"])
    return limits
