"""How ``AsyncClient`` reaches tritonserver: tritonclient's asyncio client of one server
(``tritonclient.grpc.aio``: one HTTP/2 channel that carries every call at once;
``tritonclient.http.aio``: aiohttp's pool of up to ``max_connections`` connections, and for
inference requests a leaner pool of as many, ``async_http``). Its errors are mapped and retried by
the same code as ``Client``'s (``conversation``, ``transport``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from merlin_torch_serving.client.async_http import AsyncHttpInference


class AsyncConnection:
    """One asyncio client of one server, opened in the event loop of its first call.

    aiohttp's session and gRPC's channel belong to the loop they were made in, so the client is
    made lazily (an ``AsyncClient`` may be built where no loop runs yet, at a web app's import)
    and refuses to be used from another loop until it is closed.
    """

    def __init__(self, url: str, protocol: str, timeout_s: float, max_connections: int):
        self.url, self.protocol = url, protocol
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._client: Any = None
        self._inference: AsyncHttpInference | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def call(self, method: str, *args, **kwargs):
        """tritonclient's ``method`` with these arguments, awaited."""
        client = self._client
        if client is None or asyncio.get_running_loop() is not self._loop:
            client = self._open()
        if method == "infer" and self._inference is not None:
            return await self._inference.infer(*args, **kwargs)
        return await getattr(client, method)(*args, **kwargs)

    async def close(self) -> None:
        """Close the channel or the pool; the next call opens new ones."""
        client, self._client, self._loop = self._client, None, None
        inference, self._inference = self._inference, None
        if inference is not None:
            await inference.close()
        if client is not None:
            await client.close()

    def _open(self):
        loop = asyncio.get_running_loop()
        if self._client is not None:
            raise RuntimeError(
                f"this AsyncClient of {self.url} is bound to the event loop it first ran in; make"
                " one per event loop, or close it (await client.close()) before using it in"
                " another"
            )
        if self.protocol == "grpc":
            import tritonclient.grpc.aio as grpc_aio

            self._client = grpc_aio.InferenceServerClient(self.url)
        else:
            import tritonclient.http.aio as http_aio

            self._client = http_aio.InferenceServerClient(
                self.url, conn_limit=self.max_connections, conn_timeout=self.timeout_s
            )
            self._inference = AsyncHttpInference(self.url, self.timeout_s, self.max_connections)
        self._loop = loop
        return self._client
