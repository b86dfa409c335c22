"""A web service that answers a session's recommendations from a served ensemble: POST the
session's clicks as JSON to ``/recommendations``, get its top-k raw item ids and their scores.

    pip install 'merlin-torch-serving[web]'
    MTS_URL=127.0.0.1:8001 MTS_MODEL=session_recs uvicorn examples.web_service.app:app

It is asynchronous end to end: one ``AsyncClient`` per worker process, opened when the app starts
and closed when it stops, answers every request without a thread pool, over one gRPC channel (or
a pool of HTTP connections with ``MTS_PROTOCOL=http``). The ensemble is any one with the session
example's raw columns (``session_id``, ``item_id``, ``category``, ``timestamp``) in, and
``session_id``, ``item_ids``, ``item_scores`` out, as ``examples/session_based/demo.py`` exports.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from merlin_torch_serving import (
    AsyncClient,
    InputError,
    MerlinTorchServingError,
    ServerUnavailableError,
)

#: how long the app waits at start-up for the server and the model to be ready
READY_TIMEOUT_S = 60.0


class Click(BaseModel):
    """One click of the session, as the example's raw data has it."""

    item_id: int
    category: int
    timestamp: int


class Session(BaseModel):
    session_id: int
    clicks: list[Click] = Field(min_length=1)


class Recommendations(BaseModel):
    session_id: int
    item_ids: list[int]
    scores: list[float]


def create_app(url: str, model: str, protocol: str = "grpc", timeout_s: float = 10.0) -> FastAPI:
    """The app, asking ``model`` of the tritonserver at ``url`` (``host:port``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncClient(url, protocol, timeout_s=timeout_s) as client:
            await client.wait_until_ready(model, timeout_s=READY_TIMEOUT_S)
            app.state.client = client
            yield

    app = FastAPI(title="Session-based recommendations", lifespan=lifespan)

    @app.post("/recommendations")
    async def recommendations(session: Session) -> Recommendations:
        clicks = session.clicks
        columns = {
            "session_id": [session.session_id] * len(clicks),
            "item_id": [click.item_id for click in clicks],
            "category": [click.category for click in clicks],
            "timestamp": [click.timestamp for click in clicks],
        }
        try:
            answer = await app.state.client.infer_columns(model, columns)
        except InputError as error:  # names the column and what it expected
            raise HTTPException(status_code=422, detail=str(error)) from error
        except ServerUnavailableError as error:
            raise HTTPException(status_code=503, detail=str(error)) from error
        except MerlinTorchServingError as error:
            raise HTTPException(status_code=502, detail=str(error)) from error
        return Recommendations(
            session_id=int(answer["session_id"][0]),
            item_ids=answer["item_ids"][0].tolist(),
            scores=answer["item_scores"][0].tolist(),
        )

    @app.get("/health")
    async def health() -> dict[str, bool]:
        try:
            await app.state.client.wait_until_ready(model, timeout_s=1.0)
        except MerlinTorchServingError as error:
            raise HTTPException(status_code=503, detail=str(error)) from error
        return {"ready": True}

    return app


app = create_app(
    os.environ.get("MTS_URL", "127.0.0.1:8001"),
    os.environ.get("MTS_MODEL", "session_recs"),
    os.environ.get("MTS_PROTOCOL", "grpc"),
)
