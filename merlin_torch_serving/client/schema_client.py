"""A schema-driven client: raw rows in, one DataFrame row per output row (session) out.

The client reads an ensemble's input and output schemas from the server (the exporter stores
them in the ensemble config), builds the request in the wire format, and turns the answer back
into named columns. gRPC and HTTP differ only in the tritonclient module used.

It is built for real traffic: a big input is sent in requests of whole sessions that fit the
server's row limit (see ``chunks``), every call has a timeout, every transport error is one of
the library's exceptions, and errors that are safe to retry are retried with backoff (see
``transport``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np
import pandas as pd
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.client import chunks, column_names, transport
from merlin_torch_serving.client.health import (
    ModelHealth,
    ModelStatus,
    failed_requests,
    model_statuses,
    probe_request,
    stub_answered,
    with_services,
)
from merlin_torch_serving.data import frames, tables, wire
from merlin_torch_serving.data.schemas import schema_from_json
from merlin_torch_serving.exceptions import (
    AddressError,
    InferenceError,
    MerlinTorchServingError,
    ServerUnavailableError,
    UnknownModelError,
    WrongProtocolError,
)
from merlin_torch_serving.export.config import (
    INPUT_SCHEMA_PARAMETER,
    MAX_REQUEST_ROWS_PARAMETER,
    OUTPUT_SCHEMA_PARAMETER,
    REQUEST_DIM_PARAMETER,
    REQUEST_GROUPS_PARAMETER,
)
from merlin_torch_serving.launcher import access

Protocol = Literal["grpc", "http"]
#: (rows sent so far, rows in all) after each request of a split input
Progress = Callable[[int, int], None]
_READY_POLL_S = 0.2


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


class Client:
    """Talks to one tritonserver over gRPC (default) or HTTP.

    The HTTP client is not safe to share between threads: give each thread a Client of its own
    (the gRPC one may be shared). Its connection stays open between calls; ``close()`` (or a
    ``with`` block) closes it, and ``TritonServer.stop()`` closes it when idle (see
    ``transport.Connection``).

    Parameters
    ----------
    url
        ``host:port`` of the server's gRPC or HTTP endpoint (``TritonServer.grpc_url`` /
        ``.http_url``), without a scheme.
    protocol
        ``"grpc"`` or ``"http"``.
    timeout_s
        How long one request may take before ``RequestTimeoutError`` (the HTTP client also uses it
        to connect).
    max_rows_per_request
        Split bigger inputs into requests of at most this many rows, by whole sessions (clicks
        of one session always travel together). None: as many as the served ensemble accepts
        (its ``ModelOptions.max_request_rows``).
    retries, retry_backoff_s
        Errors that are safe to retry (server unreachable, model reloading, stub restarting) are
        tried again up to ``retries`` times, waiting ``retry_backoff_s``, then twice that, ...
    admin_key
        Sent with ``models()`` and ``health()``, which read the server's restricted APIs (its
        repository index and statistics); inference needs no key. None: ``$MTS_ADMIN_KEY``, or
        the key file a ``TritonServer`` of this user wrote for this port on this machine (see
        ``TritonServer``); without one those two calls are refused.
    """

    def __init__(
        self,
        url: str,
        protocol: Protocol = "grpc",
        *,
        timeout_s: float = 60.0,
        max_rows_per_request: int | None = None,
        retries: int = 3,
        retry_backoff_s: float = 0.2,
        admin_key: str | None = None,
    ):
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol must be 'grpc' or 'http', got {protocol!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if max_rows_per_request is not None and max_rows_per_request < 1:
            raise ValueError(
                f"max_rows_per_request must be at least 1 or None, got {max_rows_per_request!r}"
            )
        self.url = _checked_address(url, protocol)
        self.protocol = protocol
        self.timeout_s = float(timeout_s)
        self.max_rows_per_request = max_rows_per_request
        self.retry_policy = transport.RetryPolicy(retries=retries, backoff_s=retry_backoff_s)
        self._admin_headers = access.headers(admin_key or access.find_admin_key(self.url), protocol)
        self._connection = transport.Connection(self.url, protocol, self.timeout_s)
        self._module = self._connection.module
        self._schemas: dict[str, ModelSchemas] = {}

    def close(self) -> None:
        """Close the connection (tritonserver waits, when it stops, for open HTTP connections)."""
        self._connection.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- metadata ---------------------------------------------------------------------------

    def schemas(self, model: str) -> ModelSchemas:
        """The model's schemas: from the ensemble config's parameters when this library exported
        it, else derived from its config's tensors (``__values``/``__offsets`` pairs are ragged)."""
        if model not in self._schemas:
            try:
                config = self._config(model)
            except InferenceError as error:
                unknown = self._unknown(model)
                if unknown is None:
                    raise
                raise unknown from error
            self._schemas[model] = schemas_from_config(config)
        return self._schemas[model]

    def models(self) -> list[ModelStatus]:
        """The server's repository index: name, version and state of every model it knows."""
        return model_statuses(
            self._call(
                None,
                "get_model_repository_index",
                headers=self._admin_headers,
                **self._json_flag(),
            )
        )

    def health(self) -> list[ModelHealth]:
        """Each model the server knows, with whether its python-backend stubs answer.

        A server in another process cannot be looked into, so each READY python model gets a
        request of no rows: a running stub answers it (or refuses it), a dead one makes the
        server say the stub "is not healthy". Ensembles and libtorch models have no stubs. The
        outside services a model calls (a feature server) are asked from this process."""
        try:
            stats = self._call(
                None,
                "get_inference_statistics",
                headers=self._admin_headers,
                **self._json_flag(),
            )
        except MerlinTorchServingError:
            stats = {}
        rows, configs = self.models(), {}
        for status in rows:
            if status.state == "READY":
                with contextlib.suppress(MerlinTorchServingError):  # a model unloaded meanwhile
                    configs[status.name] = self._config(status.name)
        ensembles = [
            name for name, config in configs.items() if config.get("platform") == "ensemble"
        ]
        failures = failed_requests(stats or {}, ensembles)
        report = []
        for status in rows:
            alive, error = None, status.reason if status.state != "READY" else ""
            if status.name in configs:
                alive, error = self._probe(status.name, configs[status.name])
            health = ModelHealth(
                status.name,
                status.version,
                status.state,
                alive,
                failures.get((status.name, status.version or 0)),
                error,
            )
            reader = partial(self._config, status.name) if status.state == "READY" else None
            report.append(with_services(health, reader))
        return report

    def wait_until_ready(self, model: str | None = None, timeout_s: float = 60.0) -> None:
        """Return once the server (and ``model``, if given) is ready; ``ServerUnavailableError``
        with the last reason after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        reason, hint = "no answer yet", ""
        while True:
            try:
                if not self._connection.call("is_server_ready"):
                    reason = "the server is not ready (models still loading?)"
                elif model is not None and not self._connection.call("is_model_ready", model):
                    reason = f"model {model!r} is not ready (not loaded, or loading)"
                    unknown = self._unknown(model)
                    if unknown is not None:
                        raise unknown
                else:
                    return
            except UnknownModelError:
                raise
            except Exception as error:  # connection refused while it starts, ...
                mapped: Exception
                try:
                    mapped, _ = transport.mapped(
                        error, url=self.url, model=model, timeout_s=self.timeout_s
                    )
                except Exception:
                    mapped = error
                if isinstance(mapped, WrongProtocolError):
                    raise mapped from error
                reason = f"{type(error).__name__}: {error}"
                hint = mapped.hint if isinstance(mapped, ServerUnavailableError) else ""
            if time.monotonic() >= deadline:
                raise ServerUnavailableError(
                    self.url, f"not ready after {timeout_s:g} s: {reason}", hint
                )
            time.sleep(_READY_POLL_S)

    # ---- inference --------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        data: pd.DataFrame | Mapping[str, object],
        *,
        columns: Mapping[str, str] | None = None,
        progress: Progress | None = None,
    ) -> pd.DataFrame:
        """Send raw rows (a DataFrame, or a dict of columns whose list cells are ragged lists)
        and get a DataFrame with one row per output row, columns in output-schema order.

        ``columns`` maps the data's column names to the model's input names
        (``{"user_session": "session_id"}``); answer columns named like a mapped input (the
        session id) come back under the data's name."""
        schemas = self.schemas(model)
        request = frames.frame_to_table(column_names.rename(data, columns), schemas.input_schema)
        answer = frames.table_to_frame(self.infer_table(model, request, progress=progress))
        return column_names.restore(answer, columns)

    def infer_table(
        self, model: str, request: TensorTable, *, progress: Progress | None = None
    ) -> TensorTable:
        """Send a request table (columns of the input schema) and get the output table; a table
        bigger than the row limit goes in several requests of whole sessions."""
        schemas = self.schemas(model)
        limits = [
            limit
            for limit in (self.max_rows_per_request, schemas.max_request_rows)
            if limit is not None
        ]
        parts = chunks.split(request, schemas.request_groups, min(limits) if limits else None)
        answers, sent, total = [], 0, tables.num_rows(request)
        for part in parts:
            answers.append(self._infer_one(model, part, schemas))
            sent += tables.num_rows(part)
            if progress is not None:
                progress(sent, total)
        return tables.concat(answers)

    # ---- helpers ----------------------------------------------------------------------------

    def _infer_one(self, model: str, request: TensorTable, schemas: ModelSchemas) -> TensorTable:
        inputs = self._infer_inputs(
            {
                name: array[np.newaxis] if schemas.request_dim else array
                for name, array in wire.to_wire(request).items()
            }
        )
        specs = {
            column.name: [
                (spec.name, schemas.response_names[column.name] + spec.name[len(column.name) :])
                for spec in wire.column_specs(column)
            ]
            for column in schemas.output_schema
        }
        outputs = [
            self._module.InferRequestedOutput(sent) for pairs in specs.values() for _, sent in pairs
        ]
        result = self._call(model, "infer", model, inputs, outputs=outputs, **self._timeout())
        arrays = {}
        for pairs in specs.values():
            for name, sent in pairs:
                array = result.as_numpy(sent)
                arrays[name] = wire.bytes_to_text(array[0] if schemas.request_dim else array)
        return wire.from_wire(arrays, schemas.output_schema)

    def _probe(self, model: str, config: dict) -> tuple[bool | None, str]:
        """Whether ``model``'s stubs answer a request of no rows (None: it has none, or it cannot
        be told), and the error that says they do not; ``config`` is the model's."""
        request = probe_request(config)
        if request is None:
            return None, ""
        inputs = self._infer_inputs(request)
        try:
            transport.call(
                lambda: self._connection.call("infer", model, inputs, **self._timeout()),
                url=self.url,
                model=model,
                timeout_s=self.timeout_s,
                policy=transport.RetryPolicy(retries=0),
            )
        except MerlinTorchServingError as error:
            answered = stub_answered(str(error))
            return answered, "" if answered else str(error)
        return True, ""

    def _infer_inputs(self, arrays: Mapping[str, np.ndarray]) -> list:
        """tritonclient's input tensors, holding ``arrays`` as they are."""
        inputs = []
        for name, array in arrays.items():
            tensor = self._module.InferInput(
                name, list(array.shape), wire.triton_dtype(array.dtype)
            )
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return inputs

    def _unknown(self, model: str) -> UnknownModelError | None:
        """An UnknownModelError listing the server's models, when it has none named ``model``."""
        try:
            known = [status.name for status in self.models()]
        except MerlinTorchServingError:
            return None
        return None if model in known else UnknownModelError(model, sorted(set(known)))

    def _config(self, model: str) -> dict:
        config = self._call(model, "get_model_config", model, **self._json_flag())
        return config.get("config", config)

    def _json_flag(self) -> dict:
        return {"as_json": True} if self.protocol == "grpc" else {}

    def _timeout(self) -> dict:
        return {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}

    def _call(self, model: str | None, method: str, *args, **kwargs):
        """tritonclient's ``method``, its errors mapped and the retryable ones retried."""
        return transport.call(
            lambda: self._connection.call(method, *args, **kwargs),
            url=self.url,
            model=model,
            timeout_s=self.timeout_s,
            policy=self.retry_policy,
        )


def _checked_address(url: str, protocol: str) -> str:
    """``url`` when it is ``host:port``; tritonclient takes no scheme (its HTTP client refuses
    one, its gRPC client fails to resolve it)."""
    scheme, sep, rest = url.partition("://")
    if sep:
        address = rest.rstrip("/")
        guess = "http" if scheme.lower() in ("http", "https") else protocol
        raise AddressError(
            url,
            f"drop the scheme: Client({address!r}, protocol={guess!r}) (--url {address})",
            "the address must be host:port",
        )
    return url


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
