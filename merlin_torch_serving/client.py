"""A schema-driven client: raw rows in, one DataFrame row per output row (session) out.

The client reads an ensemble's input and output schemas from the server (the exporter stores
them in the ensemble config), builds the request in the wire format, and turns the answer back
into named columns. gRPC and HTTP differ only in the tritonclient module used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import frames, wire
from merlin_torch_serving.exceptions import InferenceError, ServerError
from merlin_torch_serving.export.config import INPUT_SCHEMA_PARAMETER, OUTPUT_SCHEMA_PARAMETER
from merlin_torch_serving.schemas import schema_from_json
from merlin_torch_serving.server import ModelStatus

Protocol = Literal["grpc", "http"]


@dataclass(frozen=True)
class ModelSchemas:
    """What a served model takes and returns; ``response_names`` maps output columns to the
    names they travel under (see ``wire.response_name``)."""

    input_schema: Schema
    output_schema: Schema
    response_names: dict[str, str]


class Client:
    """Talks to one tritonserver over gRPC (default) or HTTP.

    Parameters
    ----------
    url
        ``host:port`` of the server's gRPC or HTTP endpoint (``TritonServer.grpc_url`` /
        ``.http_url``).
    protocol
        ``"grpc"`` or ``"http"``.
    timeout_s
        Network timeout of each call.
    """

    def __init__(self, url: str, protocol: Protocol = "grpc", *, timeout_s: float = 60.0):
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol must be 'grpc' or 'http', got {protocol!r}")
        self.url = url
        self.protocol = protocol
        self.timeout_s = timeout_s
        if protocol == "grpc":
            import tritonclient.grpc as module

            self._client = module.InferenceServerClient(url)
        else:
            import tritonclient.http as module

            self._client = module.InferenceServerClient(
                url, connection_timeout=timeout_s, network_timeout=timeout_s
            )
        self._module = module
        self._schemas: dict[str, ModelSchemas] = {}

    # ---- metadata ---------------------------------------------------------------------------

    def schemas(self, model: str) -> ModelSchemas:
        """The model's schemas: from the ensemble config's parameters when this library exported
        it, else derived from its config's tensors (``__values``/``__offsets`` pairs are ragged)."""
        if model not in self._schemas:
            config = self._call(model, self._model_config, model)
            self._schemas[model] = _schemas_from_config(config)
        return self._schemas[model]

    def models(self) -> list[ModelStatus]:
        """The server's repository index: name, version and state of every model it knows."""
        index = self._call(None, self._client.get_model_repository_index, **self._json_flag())
        entries = index.get("models", []) if isinstance(index, dict) else index
        return [
            ModelStatus(
                name=e["name"],
                version=int(e["version"]) if e.get("version") else None,
                state=e.get("state") or None,
                reason=e.get("reason", ""),
            )
            for e in entries
        ]

    # ---- inference --------------------------------------------------------------------------

    def infer(self, model: str, data: pd.DataFrame | Mapping[str, object]) -> pd.DataFrame:
        """Send raw rows (a DataFrame, or a dict of columns whose list cells are ragged lists)
        and get a DataFrame with one row per output row, columns in output-schema order."""
        schemas = self.schemas(model)
        request = frames.frame_to_table(data, schemas.input_schema)
        return frames.table_to_frame(self.infer_table(model, request))

    def infer_table(self, model: str, request: TensorTable) -> TensorTable:
        """Send a request table (columns of the input schema) and get the output table."""
        schemas = self.schemas(model)
        inputs = []
        for name, array in wire.to_wire(request).items():
            tensor = self._module.InferInput(name, list(array.shape), wire.triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        specs = {
            column.name: [
                (spec.name, schemas.response_names[column.name] + spec.name[len(column.name):])
                for spec in wire.column_specs(column)
            ]
            for column in schemas.output_schema
        }
        outputs = [self._module.InferRequestedOutput(sent) for pairs in specs.values() for _, sent in pairs]
        result = self._call(model, self._client.infer, model, inputs, outputs=outputs, **self._timeout())
        arrays = {}
        for pairs in specs.values():
            for name, sent in pairs:
                arrays[name] = wire.bytes_to_text(result.as_numpy(sent))
        return wire.from_wire(arrays, schemas.output_schema)

    # ---- helpers ----------------------------------------------------------------------------

    def _model_config(self, model: str) -> dict:
        config = self._client.get_model_config(model, **self._json_flag())
        return config.get("config", config)

    def _json_flag(self) -> dict:
        return {"as_json": True} if self.protocol == "grpc" else {}

    def _timeout(self) -> dict:
        return {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}

    def _call(self, model: str | None, function, *args, **kwargs):
        from tritonclient.utils import InferenceServerException

        try:
            return function(*args, **kwargs)
        except InferenceServerException as exc:
            message = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
            if model is None:
                raise ServerError(f"tritonserver at {self.url} ({self.protocol}): {message}") from exc
            raise InferenceError(model, message) from exc
        except ConnectionError as exc:
            raise ServerError(f"cannot reach tritonserver at {self.url} ({self.protocol}): {exc}") from exc


def _schemas_from_config(config: dict) -> ModelSchemas:
    parameters = config.get("parameters", {})
    if INPUT_SCHEMA_PARAMETER in parameters and OUTPUT_SCHEMA_PARAMETER in parameters:
        input_schema = schema_from_json(parameters[INPUT_SCHEMA_PARAMETER]["string_value"])
        output_schema = schema_from_json(parameters[OUTPUT_SCHEMA_PARAMETER]["string_value"])
        names = {c.name: wire.response_name(c.name, input_schema.column_names) for c in output_schema}
        return ModelSchemas(input_schema, output_schema, names)
    input_schema = _schema_from_tensors(config.get("input", []))
    output_schema = _schema_from_tensors(config.get("output", []))
    return ModelSchemas(input_schema, output_schema, {c.name: c.name for c in output_schema})


def _schema_from_tensors(tensors: list[dict]) -> Schema:
    """Columns from config tensors: ``c__values`` + ``c__offsets`` make one ragged column ``c``."""
    by_name = {t["name"]: t for t in tensors}
    columns = []
    for tensor in tensors:
        name = tensor["name"]
        dtype = wire.numpy_dtype(tensor["data_type"])
        dtype = "str" if dtype == np.dtype(object) else dtype
        if name.endswith(wire.OFFSETS_SUFFIX) and name[: -len(wire.OFFSETS_SUFFIX)] + wire.VALUES_SUFFIX in by_name:
            continue
        if name.endswith(wire.VALUES_SUFFIX) and name[: -len(wire.VALUES_SUFFIX)] + wire.OFFSETS_SUFFIX in by_name:
            columns.append(ColumnSchema(name[: -len(wire.VALUES_SUFFIX)], dtype=dtype, dims=(None, None)))
            continue
        dims = [int(d) for d in tensor.get("dims", [-1])]
        shape = (None,) + tuple(None if d < 0 else d for d in dims[1:])
        columns.append(ColumnSchema(name, dtype=dtype, dims=shape))
    return Schema(columns)
