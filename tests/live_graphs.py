"""The toy session graph (tests/toy_session.py) headed by ``SessionHistory``, its stateless twin,
and clicks replayed one at a time per session: what the live-session tests send and compare."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from merlin_torch_serving import (
    BlockList,
    Ensemble,
    PredictPytorch,
    SessionHistory,
    TopK,
    TransformWorkflow,
    TrendingItems,
)
from merlin_torch_serving.stores import EmbeddedSettings, RedisSettings
from tests import toy_session
from tests.redis_fixtures import unique_prefix

ANSWER_COLUMNS = ["session_id", "item_ids", "item_scores"]


def store_settings(kind: str, folder, redis_server=None, **options):
    """Settings of a store of ``kind`` ("embedded": in ``folder``; "redis": on ``redis_server``
    under a key prefix no other test uses)."""
    if kind == "embedded":
        return EmbeddedSettings(str(folder), **options)
    return RedisSettings(redis_server.url, key_prefix=unique_prefix("live"), **options)


def live_ensemble(
    workflow,
    model,
    store,
    *,
    trending=None,
    block_list: bool = False,
    block_refresh_s: float = 0.5,
    k: int = 3,
    **history_options,
) -> Ensemble:
    """new clicks >> SessionHistory >> workflow >> model >> TopK, with ``TrendingItems`` beside
    the TopK when ``trending`` is given (outputs ``trending_ids``, ``trending_scores``)."""
    scripted, input_schema, output_schema = model
    history = SessionHistory(
        store, workflow.input_schema, max_clicks=20, trending=trending, **history_options
    )
    features = history >> TransformWorkflow(workflow)
    top = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend="python")
        >> TopK(
            k,
            seen_items=features["item_id-list"],
            exclude_ids=[0, 1, 2],
            block_list=(
                BlockList(store, vocabulary=workflow, refresh_s=block_refresh_s)
                if block_list
                else None
            ),
        )
    )
    graph = features["session_id"] + top
    if trending is not None:
        graph = graph + (
            features["item_id-list"]
            >> TrendingItems(
                store,
                trending,
                workflow,
                k,
                ids_column="trending_ids",
                scores_column="trending_scores",
                refresh_s=0.0,
            )
        )
    inputs = workflow.input_schema
    if history_options.get("event_id"):
        from merlin.schema import ColumnSchema, Schema

        inputs = Schema(
            [*inputs, ColumnSchema(history_options["event_id"], dtype="int64", dims=(None,))]
        )
    return Ensemble(graph, inputs)


def plain_ensemble(workflow, model, k: int = 3) -> Ensemble:
    return Ensemble(toy_session.session_graph(workflow, model, k=k), workflow.input_schema)


def replay(clicks: pd.DataFrame, per_request: int) -> Iterator[tuple[pd.DataFrame, pd.DataFrame]]:
    """(new clicks, whole history) per request: sessions taken ``per_request`` at a time, each
    request holding the next click of each of them (those that have one), the history holding
    their clicks so far, session by session in the request's order."""
    sessions = list(dict.fromkeys(clicks["session_id"]))
    by_session = {s: rows.reset_index(drop=True) for s, rows in clicks.groupby("session_id")}
    for start in range(0, len(sessions), per_request):
        group = sessions[start : start + per_request]
        for position in range(max(len(by_session[s]) for s in group)):
            alive = [s for s in group if len(by_session[s]) > position]
            new = pd.concat([by_session[s].iloc[[position]] for s in alive], ignore_index=True)
            history = pd.concat(
                [by_session[s].iloc[: position + 1] for s in alive], ignore_index=True
            )
            yield new, history


def clicks_of(n_sessions: int, first_session: int, seed: int = 0) -> pd.DataFrame:
    return toy_session.interactions(n_sessions=n_sessions, seed=seed, first_session=first_session)
