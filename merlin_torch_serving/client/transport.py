"""How a client reaches tritonserver: its connection, what can go wrong on it, in the library's
exception tree, and which of it is safe to try again.

tritonclient raises ``InferenceServerException`` (gRPC status codes, HTTP answers), and its HTTP
client lets socket errors through as they are (``ConnectionRefusedError``, ``TimeoutError``).
Every one of them becomes a ``MerlinTorchServingError`` here. An error is retried only when the
request certainly did not run, or running it again changes nothing but load: the server could
not be reached, or the model was (re)loading, or its stub had died (a supervised server reloads
it). Timeouts are not retried: the server may still be computing the first attempt.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import weakref
from dataclasses import dataclass
from typing import TypeVar

from merlin_torch_serving.exceptions import (
    InferenceError,
    InputError,
    MerlinTorchServingError,
    RequestTimeoutError,
    ServerError,
    ServerUnavailableError,
    WrongProtocolError,
)

T = TypeVar("T")

# how tritonserver words the answers of a model that is being (re)loaded or whose stub died
_NOT_YET_SERVING = (
    "has no available versions",
    "is not at ready state",
    "is not ready",
    "is not healthy",
)
#: what to do when nothing answers at an address
NO_SERVER_HINT = (
    "start a server (`merlin-torch-serving serve REPOSITORY`, or TritonServer(repository)) or pass"
    " the address of a running one (--url HOST:PORT, Client(url))"
)

#: what to do when an admin API (repository index, statistics, ...) wants the key
ADMIN_KEY_HINT = (
    "pass the server's admin key (Client(url, admin_key=...) or $MTS_ADMIN_KEY), or call as the"
    " user that started it on this machine (its key file is found by port): this is one of its"
    " admin APIs"
)


@dataclass(frozen=True)
class RetryPolicy:
    """Up to ``retries`` more attempts, waiting ``backoff_s``, then twice that, ... (at most
    ``max_wait_s``, with +-50 % jitter so that many clients do not retry in step)."""

    retries: int = 3
    backoff_s: float = 0.2
    max_wait_s: float = 5.0

    def __post_init__(self):
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError(
                f"retries and backoff_s must not be negative, got {self.retries!r},"
                f" {self.backoff_s!r}"
            )

    def wait_s(self, attempt: int) -> float:
        return min(self.backoff_s * 2**attempt, self.max_wait_s) * random.uniform(0.5, 1.5)


class Connection:
    """tritonclient's client of one server, over gRPC or HTTP.

    An HTTP connection stays open between calls, and tritonserver's graceful stop waits for every
    open HTTP connection to close, up to its exit timeout: an idle one would hold it up all that
    time. ``close_idle_http_connections`` (which ``TritonServer.stop()`` calls) closes it, at once
    or right after the call in flight; the next call opens a new one.
    """

    def __init__(self, url: str, protocol: str, timeout_s: float):
        self.url, self.protocol, self.timeout_s = url, protocol, timeout_s
        if protocol == "grpc":
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module

            _HTTP_CONNECTIONS.add(self)
        self.module = module
        self._client = self._new_client()
        self._in_use = threading.Lock()  # held by each HTTP call, which keeps its connection
        self._close_after_call = False

    def call(self, method: str, *args, **kwargs):
        """tritonclient's ``method`` with these arguments."""
        if self.protocol == "grpc":  # may be shared by threads, and is never closed under them
            return getattr(self._client, method)(*args, **kwargs)
        try:
            with self._in_use:
                return getattr(self._client, method)(*args, **kwargs)
        finally:
            if self._close_after_call:  # asked for while this call ran
                self.close_when_idle()

    def close(self) -> None:
        self._client.close()

    def close_when_idle(self) -> None:
        """Close the connection now, or after the call using it."""
        self._close_after_call = True
        if self._in_use.acquire(blocking=False):
            try:
                self._reconnect_if_asked()
            finally:
                self._in_use.release()

    def _reconnect_if_asked(self) -> None:
        if self._close_after_call:
            self._close_after_call = False
            self._client.close()
            self._client = self._new_client()  # connects at its first call

    def _new_client(self):
        if self.protocol == "grpc":
            return self.module.InferenceServerClient(self.url)
        return self.module.InferenceServerClient(
            self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
        )


#: this process's open HTTP connections (those no one holds any more drop out)
_HTTP_CONNECTIONS: weakref.WeakSet[Connection] = weakref.WeakSet()


def close_idle_http_connections(port: int) -> None:
    """Close this process's HTTP connections to ``port`` (any host), each once it is idle."""
    for connection in list(_HTTP_CONNECTIONS):
        if connection.url.rpartition(":")[2] == str(port):
            connection.close_when_idle()


def mapped(
    error: Exception,
    *,
    url: str,
    model: str | None,
    timeout_s: float,
    answers_http: bool | None = None,
) -> tuple[MerlinTorchServingError, bool]:
    """The library's error for what tritonclient raised, and whether retrying it is safe.

    ``answers_http``: whether the address answers plain HTTP, when a gRPC call found nothing it
    understood there (see ``needs_protocol_probe``); None asks it now (``speaks_http``)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(error, MerlinTorchServingError):
        return error, False
    if isinstance(error, InferenceServerException):
        return _from_server(
            error, url=url, model=model, timeout_s=timeout_s, answers_http=answers_http
        )
    # aiohttp (the asyncio HTTP client) wraps the socket's error in its own
    error = getattr(error, "os_error", None) or error
    if (
        isinstance(error, (TimeoutError, socket.timeout)) or type(error).__name__ == "Timeout"
    ):  # gevent's
        return (
            RequestTimeoutError(model or url, timeout_s, f"{type(error).__name__}: {error}"),
            False,
        )
    if isinstance(error, http.client.HTTPException) or _is_aiohttp(error, "ClientResponseError"):
        # geventhttpclient's HTTPParseError, aiohttp's refusal of the answer: no HTTP came back
        return WrongProtocolError(url, "http", f"{type(error).__name__}: {error}"), False
    if isinstance(error, ConnectionRefusedError):
        return ServerUnavailableError(url, f"{type(error).__name__}: {error}", NO_SERVER_HINT), True
    if isinstance(error, ConnectionError) or _is_aiohttp(error, "ClientConnectionError"):
        # reset/aborted/disconnected: inference has no side effect, so running it again is harmless
        return (
            ServerUnavailableError(
                url, f"{type(error).__name__}: {error}", "is it running, and is this its address?"
            ),
            True,
        )
    if isinstance(error, OSError) or _is_aiohttp(error, "ClientError"):
        return ServerUnavailableError(url, f"{type(error).__name__}: {error}"), False
    raise error


def needs_protocol_probe(error: Exception) -> bool:
    """Whether telling what ``error`` means takes asking the address for plain HTTP: a gRPC call
    pointed at an HTTP port sees only a connection that closes (``speaks_http``)."""
    from tritonclient.utils import InferenceServerException

    if not isinstance(error, InferenceServerException):
        return False
    status, message = _status_and_message(error)
    return "UNAVAILABLE" in status and "Connection refused" not in message


def _is_aiohttp(error: Exception, name: str) -> bool:
    """Whether ``error`` is aiohttp's exception ``name`` (or below it), without importing aiohttp
    where only the blocking clients are used."""
    return any(
        cls.__name__ == name and cls.__module__.startswith("aiohttp") for cls in type(error).__mro__
    )


def _status_and_message(error) -> tuple[str, str]:
    message = error.message() if callable(getattr(error, "message", None)) else str(error)
    status = str(error.status() or "") if callable(getattr(error, "status", None)) else ""
    return status, message


def _from_server(
    error, *, url: str, model: str | None, timeout_s: float, answers_http: bool | None
) -> tuple[MerlinTorchServingError, bool]:
    status, message = _status_and_message(error)
    if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
        return RequestTimeoutError(model or url, timeout_s, "gRPC deadline exceeded"), False
    if "is restricted, expecting header" in message:
        return ServerError(f"{ADMIN_KEY_HINT}: tritonserver at {url} refused it ({message})"), False
    if "UNAVAILABLE" in status:
        if "Connection refused" in message:
            return ServerUnavailableError(url, message, NO_SERVER_HINT), True
        if answers_http if answers_http is not None else speaks_http(url):
            return WrongProtocolError(url, "grpc", message), False
        return (
            ServerUnavailableError(
                url, message or "gRPC UNAVAILABLE", "is it running, and is this its address?"
            ),
            True,
        )
    if model is None:
        return ServerError(f"tritonserver at {url}: {message}"), False
    refused = InputError.from_message(message, model=model)
    if refused is not None:
        return refused, False
    return InferenceError(model, message), any(text in message for text in _NOT_YET_SERVING)


def speaks_http(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``host:port`` answers a plain HTTP request (a gRPC client pointed at the HTTP port
    sees only a closed socket)."""
    try:
        with socket.create_connection(socket_address(url), timeout=timeout_s) as connection:
            connection.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
            return connection.recv(5) == b"HTTP/"
    except (OSError, ValueError):
        return False


def socket_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of a ``host:port`` address, as sockets take it (an IPv6 host without its
    brackets; no host: localhost). ``ValueError`` for a port that is not a number."""
    host, _, port = url.rpartition(":")
    return host.strip("[]") or "localhost", int(port)
