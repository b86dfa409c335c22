"""Schema helpers shared by graph building, export and the client: a JSON round trip that keeps
tags and properties, and the short descriptions of a column's dtype and shape used in errors."""

from __future__ import annotations

import json

from merlin.dtypes.base import ElementType
from merlin.schema import ColumnSchema, Schema
from merlin.schema.io.tensorflow_metadata import TensorflowMetadata


def schema_to_json(schema: Schema) -> str:
    """The schema as JSON with sorted keys and tags, so one schema always gives the same text."""
    data = json.loads(TensorflowMetadata.from_merlin_schema(schema).to_json())
    for feature in data.get("feature", []):
        annotation = feature.get("annotation", {})
        if "tag" in annotation:  # tags come from a set
            annotation["tag"] = sorted(annotation["tag"])
        # merlin writes no type for string (or object) columns, though it reads BYTES back as
        # strings; without it they would come back with an unknown dtype
        if schema[feature["name"]].dtype.element_type in (ElementType.String, ElementType.Object):
            feature["type"] = "BYTES"
    return json.dumps(data, sort_keys=True)


def schema_from_json(text: str) -> Schema:
    return TensorflowMetadata.from_json(text).to_merlin_schema()


def describe_column(column: ColumnSchema) -> str:
    """``int64 ragged list``, ``float32 fixed list [-1, 33]``, ``int64 scalar``."""
    shape = column.shape
    if shape.dims is None or len(shape.dims) <= 1:
        kind = "scalar"
    elif shape.is_ragged:
        kind = "ragged list"
    else:
        kind = "fixed list [" + ", ".join(
            "-1" if i == 0 or not d.is_fixed else str(d.max) for i, d in enumerate(shape.dims)
        ) + "]"
    return f"{column.dtype.without_shape.name} {kind}"
