"""``AsyncClient``'s inference requests over HTTP: KServe v2 requests (with Triton's binary tensor
extension) on kept-alive asyncio streams, a pool of them per server.

tritonclient's asyncio HTTP client goes through aiohttp, whose machinery costs a one-session
request about 0.2 ms more than tritonclient's blocking client (measured on the session example):
as much as everything else the client does. A request here is one write and two reads on a
socket that stays open. The request body and the answer are tritonclient's own
(``generate_request_body``, ``InferResult.from_response_body``), and its errors are tritonclient's
and the socket's, so ``transport.mapped`` maps them as it maps every other call's. Everything but
inference (metadata, configuration, health) still goes through tritonclient's asyncio client.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections import deque
from urllib.parse import quote

from merlin_torch_serving.client import transport

#: how long a connection stays open unused (aiohttp's default): tritonserver, stopping, waits for
#: the connections its clients keep open
KEEP_IDLE_S = 15.0


class AsyncHttpInference:
    """Inference requests to one tritonserver's HTTP port, at most ``max_connections`` at once,
    each on a connection of the pool (opened when none is idle, kept open after the answer)."""

    def __init__(self, url: str, timeout_s: float, max_connections: int):
        self._host, self._port = transport.socket_address(url)
        self._authority = url.encode()
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        #: connections ready for a request, each with when it was last used (most recent last)
        self._idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = deque()
        self._sweep: asyncio.TimerHandle | None = None

    async def infer(
        self, model_name: str, inputs, outputs=None, request_id: str = "", headers=None
    ):
        """tritonclient's ``InferResult`` of one request; tritonclient's ``infer`` arguments that
        the clients use (``model_name``, ``inputs``, ``outputs``, ``request_id``, ``headers``)."""
        from tritonclient.http import InferenceServerClient

        body, json_size = InferenceServerClient.generate_request_body(
            inputs, outputs=outputs, request_id=request_id
        )
        head = [
            b"POST /v2/models/%s/infer HTTP/1.1" % quote(model_name, safe="").encode(),
            b"Host: " + self._authority,
            b"Content-Type: application/octet-stream",
            b"Content-Length: %d" % len(body),
        ]
        if json_size is not None:
            head.append(b"Inference-Header-Content-Length: %d" % json_size)
        head.extend(f"{name}: {value}".encode("latin-1") for name, value in (headers or {}).items())
        request = b"\r\n".join(head) + b"\r\n\r\n" + body
        async with self._slots, asyncio.timeout(self._timeout_s):
            status, answer_headers, answer = await self._exchange(request)
        if status != 200:
            raise _server_error(status, answer)
        length = answer_headers.get("inference-header-content-length")
        from tritonclient.http import InferResult

        return InferResult.from_response_body(
            answer, False, int(length) if length else None, answer_headers.get("content-encoding")
        )

    async def close(self) -> None:
        """Close the idle connections (those in use close when their request ends)."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._idle:
            _, writer, _ = self._idle.popleft()
            writer.close()

    async def _exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send ``request`` on a pooled connection and read its answer. Kept-alive connections
        the server (or a proxy) closed while they were idle answer nothing: they are dropped and
        the request goes on the next one, or a new one. A connection is put back only after a
        whole answer that does not ask to close it (a cancelled or failed exchange closes it, so
        no later request reads what was left of this one)."""
        while self._idle:
            reader, writer, _ = self._idle.pop()
            try:
                return await self._on(reader, writer, request)
            except ConnectionError:
                continue
            except asyncio.IncompleteReadError as error:
                if error.partial:
                    raise _cut_short(error) from error
        reader, writer = await asyncio.open_connection(self._host, self._port)
        try:
            return await self._on(reader, writer, request)
        except asyncio.IncompleteReadError as error:
            raise _cut_short(error) from error

    async def _on(self, reader, writer, request: bytes) -> tuple[int, dict[str, str], bytes]:
        kept = False
        try:
            writer.write(request)
            await writer.drain()
            status, headers = _head(await reader.readuntil(b"\r\n\r\n"))
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                body = await _chunks(reader)
            else:
                raise http.client.HTTPException("an answer without a length")
            kept = headers.get("connection", "").lower() != "close"
            return status, headers, body
        except asyncio.LimitOverrunError as error:
            raise http.client.HTTPException("an answer's head too long") from error
        finally:
            if kept:
                self._keep(reader, writer)
            else:
                writer.close()

    def _keep(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Put a connection back in the pool, and have those unused for ``KEEP_IDLE_S`` closed."""
        loop = asyncio.get_running_loop()
        self._idle.append((reader, writer, loop.time()))
        if self._sweep is None:
            self._sweep = loop.call_later(KEEP_IDLE_S, self._close_unused)

    def _close_unused(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweep = None
        while self._idle and loop.time() - self._idle[0][2] >= KEEP_IDLE_S:
            _, writer, _ = self._idle.popleft()
            writer.close()
        if self._idle:
            wait_s = KEEP_IDLE_S - (loop.time() - self._idle[0][2])
            self._sweep = loop.call_later(wait_s, self._close_unused)


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    """The status and headers (names in lower case) of an answer's head."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise http.client.BadStatusLine(lines[0][:80])
    headers = {}
    for line in lines[1:]:
        name, separator, value = line.partition(":")
        if separator:
            headers[name.strip().lower()] = value.strip()
    return int(rest[:3]), headers


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, its chunks joined."""
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers from tritonserver: the closing line
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _cut_short(error: asyncio.IncompleteReadError) -> ConnectionResetError:
    return ConnectionResetError(
        f"tritonserver closed the connection after {len(error.partial)} bytes of an answer"
    )


def _server_error(status: int, body: bytes):
    """tritonclient's exception for an answer that is not 200, as its clients raise it."""
    from tritonclient.utils import InferenceServerException

    try:
        message = json.loads(body)["error"] if body else "an empty answer"
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:500]
    return InferenceServerException(msg=message, status=str(status))
