"""What a served model takes and returns, as a client reads it from the model's configuration:
the schemas this library's exporter stores in an ensemble config, or schemas derived from the
config's tensors for any other model."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import schema_from_json
from merlin_torch_serving.export.config import (
    INPUT_SCHEMA_PARAMETER,
    MAX_REQUEST_ROWS_PARAMETER,
    OUTPUT_SCHEMA_PARAMETER,
    REQUEST_DIM_PARAMETER,
    REQUEST_GROUPS_PARAMETER,
)


@dataclass(frozen=True)
class ModelSchemas:
    """What a served model takes and returns; ``response_names`` maps output columns to the
    names they travel under (see ``wire.response_name``). ``request_groups`` are the request
    columns a big request may be split by (``[]``: any rows; None: it must not be split) and
    ``max_request_rows`` the most rows the server takes in one request (None: no limit known).
    ``request_dim``: every tensor travels with a leading dimension of 1 (an ensemble exported
    with ``ModelOptions(batching=True)``; see data/wire.py)."""

    input_schema: Schema
    output_schema: Schema
    response_names: dict[str, str]
    request_groups: list[str] | None = None
    max_request_rows: int | None = None
    request_dim: bool = False


def schemas_from_config(config: dict) -> ModelSchemas:
    """What a model takes and returns, from its config (the JSON form Triton serves), as ``Client``
    reads it."""
    parameters = {
        key: value.get("string_value") for key, value in config.get("parameters", {}).items()
    }
    if INPUT_SCHEMA_PARAMETER in parameters and OUTPUT_SCHEMA_PARAMETER in parameters:
        input_schema = schema_from_json(parameters[INPUT_SCHEMA_PARAMETER])
        output_schema = schema_from_json(parameters[OUTPUT_SCHEMA_PARAMETER])
        names = {
            c.name: wire.response_name(c.name, input_schema.column_names) for c in output_schema
        }
        groups = (
            json.loads(parameters[REQUEST_GROUPS_PARAMETER])
            if REQUEST_GROUPS_PARAMETER in parameters
            else None
        )
        limit = parameters.get(MAX_REQUEST_ROWS_PARAMETER)
        request_dim = parameters.get(REQUEST_DIM_PARAMETER) == "true"
        return ModelSchemas(
            input_schema, output_schema, names, groups, int(limit) if limit else None, request_dim
        )
    input_schema = _schema_from_tensors(config.get("input", []))
    output_schema = _schema_from_tensors(config.get("output", []))
    return ModelSchemas(input_schema, output_schema, {c.name: c.name for c in output_schema})


def _schema_from_tensors(tensors: list[dict]) -> Schema:
    """Columns from config tensors: ``c__values`` + ``c__offsets`` make one ragged column ``c``."""
    by_name = {t["name"]: t for t in tensors}
    columns = []
    for tensor in tensors:
        name = tensor["name"]
        numpy_dtype = wire.numpy_dtype(tensor["data_type"])
        dtype = "str" if numpy_dtype == np.dtype(object) else numpy_dtype
        if (
            name.endswith(wire.OFFSETS_SUFFIX)
            and name[: -len(wire.OFFSETS_SUFFIX)] + wire.VALUES_SUFFIX in by_name
        ):
            continue
        if (
            name.endswith(wire.VALUES_SUFFIX)
            and name[: -len(wire.VALUES_SUFFIX)] + wire.OFFSETS_SUFFIX in by_name
        ):
            columns.append(
                ColumnSchema(name[: -len(wire.VALUES_SUFFIX)], dtype=dtype, dims=(None, None))
            )
            continue
        dims = [int(d) for d in tensor.get("dims", [-1])]
        shape = (None,) + tuple(None if d < 0 else d for d in dims[1:])
        columns.append(ColumnSchema(name, dtype=dtype, dims=shape))
    return Schema(columns)
