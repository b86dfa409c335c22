"""Transformers4Rec's getting-started workflow, with its Filter that drops one-click sessions,
behind a route: the sessions it drops, and those of unknown items only, are answered by the most
popular items of their last click's category (fitted on the training clicks), marked with the
branch; the others by the XLNet model on libtorch, exactly as without the route; served over gRPC
and HTTP as in-process."""

from __future__ import annotations

import numpy as np
import pytest

from merlin_torch_serving import (
    AllItemsUnknown,
    Client,
    DecodeItemIds,
    Ensemble,
    FilteredOut,
    ItemPopularity,
    MostPopular,
    PredictPytorch,
    Route,
    TopK,
    TransformWorkflow,
)
from tests.official import getting_started
from tests.official.example import TOP_K, UNSEEN_ITEM_ID, request_rows
from tests.official.test_served import assert_same_answer
from tests.session_models import RESERVED_IDS

pytestmark = pytest.mark.integration

NAME = "official-routed"


@pytest.fixture(scope="module")
def routed(triton_server, pytorch_backend, getting_started_example):
    """The routed ensemble, and the unrouted one of the same model (the official graph)."""
    workflow = getting_started_example.workflow
    features = workflow.input_schema.column_names >> TransformWorkflow(
        workflow, filtered_sessions="unfiltered"
    )
    model = (
        features
        >> PredictPytorch(getting_started_example.model, backend="pytorch")
        >> TopK(TOP_K, seen_items=features["item_id-list"], exclude_ids=RESERVED_IDS)
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    popularity = ItemPopularity.fit(getting_started.interactions(seed=0), workflow)
    popular = (
        features
        >> MostPopular(popularity, TOP_K)
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    route = Route(
        {"model": model, "popular": popular},
        rules=[(FilteredOut(), "popular"), (AllItemsUnknown(), "popular")],
        default="model",
        fallback="popular",
        inline=["popular"],
    )
    ensemble = Ensemble(features >> route, workflow.input_schema)
    ensemble.export(triton_server.repository, NAME)
    triton_server.load(f"{NAME}.model")
    triton_server.load(NAME)
    return ensemble, getting_started_example.ensemble("pytorch"), popularity


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", [1, 7, 32])
def test_the_sessions_the_filter_drops_are_answered_by_the_fallback_served_as_in_process(
    triton_server, routed, getting_started_example, protocol, n_sessions
):
    ensemble, unrouted, _ = routed
    rows = request_rows(getting_started_example, n_sessions, seed=300 + n_sessions)
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    answer = Client(url, protocol=protocol).infer(NAME, rows)
    assert_same_answer(answer, ensemble.transform(rows))

    dropped = answer["filtered_out"].to_numpy()
    assert dropped.sum() == 1  # the one-click session
    unknown = rows.groupby("session_id")["item_id"].agg(lambda s: (s >= UNSEEN_ITEM_ID).all())
    to_popular = dropped | unknown[answer["session_id"]].to_numpy()
    assert answer["branch"].tolist() == np.where(to_popular, "popular", "model").tolist()
    assert (answer["branch_error"] == "").all()
    # the fallback's answers are raw item ids, none of them the session's own
    for _, row in answer[to_popular].iterrows():
        clicked = rows.loc[rows["session_id"] == row["session_id"], "item_id"]
        assert (row["item_ids"] > 0).all()
        assert not set(row["item_ids"]) & set(clicked)
    # the model's sessions are answered as the official graph answers them, bit for bit
    official = unrouted.transform(rows)
    model_rows = ~to_popular
    if model_rows.any():
        assert_same_answer(
            answer.loc[model_rows, list(official.columns)].reset_index(drop=True),
            official[model_rows].reset_index(drop=True),
        )


def test_a_one_click_session_gets_the_most_clicked_items_of_its_clicks_category(
    triton_server, routed, getting_started_example
):
    rows = request_rows(getting_started_example, 1, seed=8)
    answer = Client(triton_server.grpc_url).infer(NAME, rows)
    assert answer["filtered_out"].tolist() == [True]
    assert answer["branch"].tolist() == ["popular"]
    clicked = rows["item_id"].iloc[0]
    train = getting_started.interactions(seed=0)
    in_category = train[train["category"] == rows["category"].iloc[0]]
    clicks = in_category[in_category["item_id"] != clicked]["item_id"].value_counts()
    ids = list(answer["item_ids"][0])
    from_category = ids[: min(TOP_K, len(clicks))]
    # the category's most clicked items, most first (ties in any order), then the catalog's
    assert (
        sorted(clicks[from_category].tolist(), reverse=True)
        == clicks.tolist()[: len(from_category)]
    )
    assert clicks[from_category].is_monotonic_decreasing
    assert clicked not in ids
    assert not set(ids[len(from_category) :]) & set(clicks.index)
