"""Trending items counted by the store as clicks arrive equal the same counts recomputed over the
same clicks in batch, with a window or a decay; TrendingItems answers from them, and a route
takes it as the branch that answers for a failed one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import (
    Ensemble,
    FewerKnownItems,
    PredictPytorch,
    Route,
    SessionHistory,
    TopK,
    TransformWorkflow,
    Trending,
    TrendingItems,
)
from merlin_torch_serving.data.vocabulary import CategoryVocabulary
from merlin_torch_serving.stores import open_store
from tests.live_graphs import clicks_of, live_ensemble, replay


def sent_through(live, clicks: pd.DataFrame) -> pd.DataFrame:
    """Replay ``clicks`` (7 sessions a request), every request sent twice; the last answers."""
    answer = None
    for new, _ in replay(clicks, 7):
        live.transform(new)
        answer = live.transform(new)
    return answer


@pytest.mark.parametrize("half_life", [None, 3.0])
def test_counts_kept_as_clicks_arrive_equal_the_batch_recount(
    store, toy_workflow, toy_model, half_life
):
    trending = Trending(bucket=500, window=8, half_life=half_life, name="clicks")
    live = live_ensemble(toy_workflow, toy_model, store, trending=trending)
    clicks = clicks_of(30, 60_000, seed=3)
    sent_through(live, clicks)
    with open_store(store) as opened:
        kept = opened.trending_counts("clicks", trending.window)
    batch = trending.batch_counts(clicks)
    assert kept == batch
    assert kept.latest == clicks["timestamp"].max() // 500
    assert 1 < len(kept.buckets) <= 8
    # the ranking, recomputed independently of Trending.ranked
    recent = clicks[clicks["timestamp"] // 500 > batch.latest - 8]
    age = batch.latest - recent["timestamp"] // 500
    weight = 1.0 if half_life is None else 0.5 ** (age / half_life)
    expected = recent.assign(w=weight).groupby("item_id")["w"].sum()
    items, weights = trending.ranked(kept)
    np.testing.assert_allclose(weights, expected.loc[[int(i) for i in items]].to_numpy())
    assert (np.diff(weights) <= 0).all()


def test_trending_items_answer_the_top_items_a_session_has_not_seen(store, toy_workflow, toy_model):
    trending = Trending(bucket=1_000_000, window=1, name="all")
    live = live_ensemble(toy_workflow, toy_model, store, trending=trending, k=4)
    clicks = clicks_of(20, 70_000, seed=4)
    answer = sent_through(live, clicks)
    vocabulary = CategoryVocabulary.from_workflow(toy_workflow, "item_id")
    counts = clicks["item_id"].value_counts()
    ranked = sorted(counts.index, key=lambda item: (-counts[item], item))
    encoded = {raw: i for i, raw in enumerate(vocabulary.raw_values) if vocabulary.is_item[i]}
    last = clicks[clicks["session_id"].isin(answer["session_id"])]
    for session, ids, scores in zip(
        answer["session_id"], answer["trending_ids"], answer["trending_scores"], strict=True
    ):
        seen = set(last.loc[last["session_id"] == session, "item_id"])
        want = [item for item in ranked if item not in seen][:4]
        assert [vocabulary.raw_values[i] for i in ids] == want
        np.testing.assert_allclose(scores, [counts[i] / len(clicks) for i in want], rtol=1e-6)
        assert all(encoded[item] in ids for item in want)


def test_a_route_takes_trending_items_as_a_branch_and_as_its_fallback(
    tmp_path, toy_workflow, toy_model
):
    store = tmp_path / "store"
    trending = Trending(bucket=1_000_000, window=1)
    scripted, input_schema, output_schema = toy_model
    features = SessionHistory(
        store, toy_workflow.input_schema, max_clicks=20, trending=trending
    ) >> TransformWorkflow(toy_workflow)
    model = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema)
        >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
    )
    popular = features >> TrendingItems(store, trending, toy_workflow, 3)
    route = features >> Route(
        {"model": model, "trending": popular},
        rules=[(FewerKnownItems(2), "trending")],
        default="model",
        fallback="trending",
    )
    graph = Ensemble(route, toy_workflow.input_schema)
    clicks = clicks_of(10, 80_000, seed=5)
    graph.transform(clicks)  # counted
    one_click = clicks_of(1, 90_000, seed=6).iloc[:1]
    answer = graph.transform(one_click)
    assert answer["branch"].tolist() == ["trending"]
    expected = Ensemble(features["session_id"] + popular, toy_workflow.input_schema).transform(
        one_click
    )
    np.testing.assert_array_equal(np.stack(answer["item_ids"]), np.stack(expected["item_ids"]))
