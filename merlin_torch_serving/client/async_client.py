"""The schema-driven client for asyncio services (FastAPI, Starlette, aiohttp): ``Client``'s
contract, awaited. Raw rows in, one row per session out, the same checks and errors naming the
column, the same splitting of big requests, retries and admin key: all of it is
``conversation``'s, carried out here with awaited calls over tritonclient's asyncio clients
(``async_transport``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving.client import conversation
from merlin_torch_serving.client.async_transport import AsyncConnection
from merlin_torch_serving.client.conversation import Progress, Steps, T
from merlin_torch_serving.client.health import ModelHealth, ModelStatus
from merlin_torch_serving.client.model_schemas import ModelSchemas
from merlin_torch_serving.client.schema_client import Protocol


class AsyncClient(conversation.ClientSettings):
    """Talks to one tritonserver over gRPC (default) or HTTP from an event loop:
    ``await client.infer(model, rows)`` answers what ``Client.infer`` answers.

    One client holds one connection pool (gRPC: one HTTP/2 channel that carries every call at
    once; HTTP: up to ``max_connections`` connections) and serves any number of concurrent
    coroutines of the event loop it first runs in: make one per process (per worker of a web
    server), at start-up, and close it at shutdown (``await client.close()``, or
    ``async with``). A cancelled call stops where it waits: its request is abandoned on the wire
    (gRPC cancels the call; HTTP drops its connection from the pool), and no later part of a
    split request is sent.

    The parameters are ``Client``'s, plus ``max_connections``: the most HTTP connections the pool
    opens at once (gRPC needs one).
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
        max_connections: int = 100,
    ):
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
        self._conversation = conversation.Conversation(
            url,
            protocol,
            timeout_s=timeout_s,
            max_rows_per_request=max_rows_per_request,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            admin_key=admin_key,
        )
        self._connection = AsyncConnection(self.url, protocol, self.timeout_s, max_connections)

    async def close(self) -> None:
        """Close the connections (tritonserver waits, when it stops, for open HTTP ones)."""
        await self._connection.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    # ---- metadata ---------------------------------------------------------------------------

    async def schemas(self, model: str) -> ModelSchemas:
        """``Client.schemas``: read once per model and client."""
        return await self._run(self._conversation.schemas(model))

    async def models(self) -> list[ModelStatus]:
        """``Client.models``: the server's repository index (wants the admin key)."""
        return await self._run(self._conversation.models())

    async def health(self) -> list[ModelHealth]:
        """``Client.health``: each model, with whether its python-backend stubs answer."""
        return await self._run(self._conversation.health())

    async def wait_until_ready(self, model: str | None = None, timeout_s: float = 60.0) -> None:
        """``Client.wait_until_ready``: return once the server, or ``model`` if named, is ready."""
        return await self._run(self._conversation.wait_until_ready(model, timeout_s))

    # ---- inference --------------------------------------------------------------------------

    async def infer(
        self,
        model: str,
        data: pd.DataFrame | Mapping[str, object],
        *,
        columns: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        request_id: str = "",
    ) -> pd.DataFrame:
        """``Client.infer``: raw rows in (a DataFrame or a dict of columns), a DataFrame with one
        row per output row out."""
        return await self._run(
            self._conversation.infer(model, data, columns, progress, "frame", request_id)
        )

    async def infer_columns(
        self,
        model: str,
        data: pd.DataFrame | Mapping[str, object],
        *,
        columns: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        request_id: str = "",
    ) -> dict[str, Any]:
        """``Client.infer_columns``: ``infer`` answering a dict of columns."""
        return await self._run(
            self._conversation.infer(model, data, columns, progress, "columns", request_id)
        )

    async def infer_table(
        self,
        model: str,
        request: TensorTable,
        *,
        progress: Progress | None = None,
        request_id: str = "",
    ) -> TensorTable:
        """``Client.infer_table``: a request table in, the output table out."""
        return await self._run(self._conversation.infer_table(model, request, progress, request_id))

    async def _run(self, steps: Steps[T]) -> T:
        return await conversation.run_async(steps, self._connection.call)
