"""What a schema-driven client says to tritonserver and makes of its answers, written once for
``Client`` and ``AsyncClient``.

Each operation (``infer``, ``schemas``, ``health``, ...) is a generator that yields the I/O it
needs, a tritonclient ``Call``, a ``Pause`` before a retry or a ``Blocking`` function, and is sent
back its outcome (or has the error thrown in). ``run`` carries the steps out with blocking calls
for ``Client``, ``run_async`` with awaited ones for ``AsyncClient``: request building, checks,
splitting, retries, error mapping and answer decoding are the same code for both, and only the
transport differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving.client import chunks, transport
from merlin_torch_serving.client.codec import ModelCodec, OutputFormat, infer_inputs
from merlin_torch_serving.client.health import (
    ModelHealth,
    ModelStatus,
    failed_requests,
    model_statuses,
    names_services,
    probe_request,
    standby_error,
    standbys_run,
    stub_answered,
    with_services,
)
from merlin_torch_serving.client.model_schemas import ModelSchemas, schemas_from_config
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.exceptions import (
    AddressError,
    InferenceError,
    MerlinTorchServingError,
    ServerUnavailableError,
    UnknownModelError,
    WrongProtocolError,
)
from merlin_torch_serving.launcher import access

T = TypeVar("T")
#: (rows sent so far, rows in all) after each request of a split input
Progress = Callable[[int, int], None]
_READY_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Call:
    """tritonclient's ``method`` of the client's connection, with these arguments."""

    method: str
    args: tuple
    kwargs: dict


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Blocking:
    """A function that blocks (a probe of a socket, a health check over urllib): an event loop
    runs it in a thread."""

    function: Callable[[], Any]


Step = Call | Pause | Blocking
Steps = Generator[Step, Any, T]


def run(steps: Steps[T], call: Callable[..., Any]) -> T:
    """Carry ``steps`` out in this thread; ``call(method, *args, **kwargs)`` is tritonclient's."""
    reply: Any = None
    failure: Exception | None = None
    try:
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration as done:
                return done.value
            reply, failure = None, None
            try:
                if isinstance(step, Call):
                    reply = call(step.method, *step.args, **step.kwargs)
                elif isinstance(step, Pause):
                    time.sleep(step.seconds)
                else:
                    reply = step.function()
            except Exception as error:  # thrown into the steps, which map it
                failure = error
    finally:
        steps.close()


async def run_async(steps: Steps[T], call: Callable[..., Awaitable[Any]]) -> T:
    """``run`` in an event loop: calls and pauses are awaited, blocking functions run in a
    thread. A cancelled caller stops the steps where they wait."""
    reply: Any = None
    failure: Exception | None = None
    try:
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration as done:
                return done.value
            reply, failure = None, None
            try:
                if isinstance(step, Call):
                    reply = await call(step.method, *step.args, **step.kwargs)
                elif isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                else:
                    reply = await asyncio.to_thread(step.function)
            except Exception as error:  # thrown into the steps, which map it
                failure = error
    finally:
        steps.close()


class Conversation:
    """Everything a client knows and does but the transport: its settings (checked here, see
    ``Client`` for what they mean) and what it learned of each model (``ModelCodec``)."""

    def __init__(
        self,
        url: str,
        protocol: str,
        *,
        timeout_s: float,
        max_rows_per_request: int | None,
        retries: int,
        retry_backoff_s: float,
        admin_key: str | None,
    ):
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol must be 'grpc' or 'http', got {protocol!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if max_rows_per_request is not None and max_rows_per_request < 1:
            raise ValueError(
                f"max_rows_per_request must be at least 1 or None, got {max_rows_per_request!r}"
            )
        self.url = checked_address(url, protocol)
        self.protocol = protocol
        self.timeout_s = float(timeout_s)
        self.max_rows_per_request = max_rows_per_request
        self.retry_policy = transport.RetryPolicy(retries=retries, backoff_s=retry_backoff_s)
        self._admin_headers = access.headers(admin_key or access.find_admin_key(self.url), protocol)
        if protocol == "grpc":  # the asyncio clients take the same tensors as these
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module
        self.module = module
        # gRPC bounds each call by a deadline; the HTTP clients bound every call they make
        self._timeout = {"client_timeout": self.timeout_s} if protocol == "grpc" else {}
        self._json = {"as_json": True} if protocol == "grpc" else {}
        self._codecs: dict[str, ModelCodec] = {}

    # ---- metadata -----------------------------------------------------------------------------

    def schemas(self, model: str) -> Steps[ModelSchemas]:
        return (yield from self.codec(model)).schemas

    def codec(self, model: str) -> Steps[ModelCodec]:
        """What the client learned of ``model``, asked of the server the first time."""
        codec = self._codecs.get(model)
        if codec is None:
            try:
                config = yield from self._config(model)
            except InferenceError as error:
                unknown = yield from self._unknown(model)
                if unknown is None:
                    raise
                raise unknown from error
            codec = self._codecs[model] = ModelCodec(schemas_from_config(config), self.module)
        return codec

    def models(self) -> Steps[list[ModelStatus]]:
        index = yield from self.call(
            None,
            "get_model_repository_index",
            headers=self._admin_headers,
            **self._json,
            **self._timeout,
        )
        return model_statuses(index)

    def health(self) -> Steps[list[ModelHealth]]:
        try:
            stats = yield from self.call(
                None,
                "get_inference_statistics",
                headers=self._admin_headers,
                **self._json,
                **self._timeout,
            )
        except MerlinTorchServingError:
            stats = {}
        statuses = yield from self.models()
        configs = {}
        for status in statuses:
            if status.state == "READY":
                with contextlib.suppress(MerlinTorchServingError):  # unloaded meanwhile
                    configs[status.name] = yield from self._config(status.name)
        ensembles = [name for name, c in configs.items() if c.get("platform") == "ensemble"]
        failures = failed_requests(stats or {}, ensembles)
        standbys = standbys_run(configs[name] for name in ensembles)
        report = []
        for status in statuses:
            alive, error, config = None, status.reason if status.state != "READY" else "", None
            standby = ""
            if status.state == "READY":
                config = configs.get(status.name)
                alive, error = yield from self._probe(status.name, config)
                standby = standbys.get(status.name, "")
            health = ModelHealth(
                status.name,
                status.version,
                status.state,
                alive,
                failures.get((status.name, status.version or 0)),
                error or (standby_error(standby) if standby else ""),
                standby=standby,
            )
            if config is not None and names_services(config):
                health = yield Blocking(partial(with_services, health, partial(dict, config)))
            report.append(health)
        return report

    def wait_until_ready(self, model: str | None, timeout_s: float) -> Steps[None]:
        deadline = time.monotonic() + timeout_s
        reason, hint = "no answer yet", ""
        while True:
            try:
                # with a model named, its readiness is what counts: a server where another model
                # failed to load is live but never ready
                if model is None and not (yield Call("is_server_ready", (), self._timeout)):
                    reason = "the server is not ready (models still loading?)"
                elif model is not None and not (yield Call("is_server_live", (), self._timeout)):
                    reason = "the server is not live yet"
                elif model is not None and not (
                    yield Call("is_model_ready", (model,), self._timeout)
                ):
                    reason = f"model {model!r} is not ready (not loaded, or loading)"
                    unknown = yield from self._unknown(model)
                    if unknown is not None:
                        raise unknown
                else:
                    return
            except UnknownModelError:
                raise
            except Exception as error:  # connection refused while it starts, ...
                mapped: Exception
                try:
                    mapped, _ = yield from self._mapped(error, model)
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
            yield Pause(_READY_POLL_S)

    # ---- inference ----------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        data: pd.DataFrame | Mapping[str, object],
        columns: Mapping[str, str] | None,
        progress: Progress | None,
        output_format: OutputFormat,
        request_id: str = "",
    ) -> Steps[Any]:
        codec = self._codecs.get(model) or (yield from self.codec(model))
        request = codec.request_columns(data, columns)
        answer = yield from self._send(model, codec, request, progress, request_id)
        if output_format == "frame":
            return codec.frame(answer, columns)
        return codec.columns(answer, columns)

    def infer_table(
        self, model: str, request: TensorTable, progress: Progress | None, request_id: str = ""
    ) -> Steps[TensorTable]:
        codec = self._codecs.get(model) or (yield from self.codec(model))
        frames.check_columns(list(request.columns), codec.schemas.input_schema)
        columns = wire.table_columns(request)
        answer = yield from self._send(model, codec, columns, progress, request_id)
        return TensorTable(answer, _unsafe=True)

    def _send(
        self,
        model: str,
        codec: ModelCodec,
        request: chunks.Columns,
        progress: Progress | None,
        request_id: str = "",
    ) -> Steps[chunks.Columns]:
        """The answer to ``request``, sent in parts of whole sessions that fit the row limits,
        each under Triton's ``request_id`` (an answer log records it)."""
        answers, sent, total = [], 0, chunks.columns_rows(request)
        for part in codec.requests(request, self.max_rows_per_request):
            result = yield from self.call(
                model,
                "infer",
                model,
                codec.inputs(part),
                outputs=codec.requested_outputs,
                request_id=request_id,
                **self._timeout,
            )
            answers.append(codec.answer_columns(result))
            sent += chunks.columns_rows(part)
            if progress is not None:
                progress(sent, total)
        return codec.joined(answers)

    # ---- calls --------------------------------------------------------------------------------

    def call(self, model: str | None, method: str, *args, **kwargs) -> Steps[Any]:
        """tritonclient's ``method``, its errors mapped and the retryable ones retried."""
        attempt = 0
        while True:
            try:
                return (yield Call(method, args, kwargs))
            except Exception as error:
                mapped, retryable = yield from self._mapped(error, model)
                if not retryable or attempt >= self.retry_policy.retries:
                    raise mapped from error
                yield Pause(self.retry_policy.wait_s(attempt))
                attempt += 1

    def _mapped(
        self, error: Exception, model: str | None
    ) -> Steps[tuple[MerlinTorchServingError, bool]]:
        answers_http = None
        if transport.needs_protocol_probe(error):
            answers_http = yield Blocking(partial(transport.speaks_http, self.url))
        return transport.mapped(
            error, url=self.url, model=model, timeout_s=self.timeout_s, answers_http=answers_http
        )

    def _config(self, model: str) -> Steps[dict]:
        config = yield from self.call(
            model, "get_model_config", model, **self._json, **self._timeout
        )
        return config.get("config", config)

    def _unknown(self, model: str) -> Steps[UnknownModelError | None]:
        """An UnknownModelError listing the server's models, when it has none named ``model``."""
        try:
            known = [status.name for status in (yield from self.models())]
        except MerlinTorchServingError:
            return None
        return None if model in known else UnknownModelError(model, sorted(set(known)))

    def _probe(self, model: str, config: dict | None) -> Steps[tuple[bool | None, str]]:
        """Whether ``model``'s stubs answer a request of no rows (None: it has none, or it cannot
        be told), and the error that says they do not."""
        request = probe_request(config) if config is not None else None
        if request is None:
            return None, ""
        try:
            yield Call("infer", (model, infer_inputs(self.module, request)), self._timeout)
        except Exception as error:
            mapped, _ = yield from self._mapped(error, model)
            answered = stub_answered(str(mapped))
            return answered, "" if answered else str(mapped)
        return True, ""


class ClientSettings:
    """The settings a client (``Client``, ``AsyncClient``) was made with, as its conversation
    holds them."""

    _conversation: Conversation

    @property
    def url(self) -> str:
        return self._conversation.url

    @property
    def protocol(self) -> str:
        return self._conversation.protocol

    @property
    def timeout_s(self) -> float:
        return self._conversation.timeout_s

    @property
    def max_rows_per_request(self) -> int | None:
        return self._conversation.max_rows_per_request

    @property
    def retry_policy(self) -> transport.RetryPolicy:
        return self._conversation.retry_policy


def checked_address(url: str, protocol: str) -> str:
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
