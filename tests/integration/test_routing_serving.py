"""A routed ensemble on the real tritonserver: the route's python step calls each model branch's
own ensemble through BLS (one model on the python backend, its copy on libtorch) and computes the
most popular items itself, and over gRPC and HTTP every session's answer equals in-process; new
weights take effect with a reload under load and no failed request; 10,000 sessions split as
weighed and keep their variant; an unloaded branch leaves the other sessions answered."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import (
    Client,
    DecodeItemIds,
    Ensemble,
    MostPopular,
    TransformWorkflow,
)
from merlin_torch_serving.export.manifest import verify_export
from merlin_torch_serving.export.step_metrics import FLUSH_INTERVAL_S
from merlin_torch_serving.routing import set_weights
from tests import routed_graphs, toy_session
from tests.integration.test_metrics import scrape, value
from tests.served import Traffic, assert_async_client_answers_as_client, assert_frames_equal

pytestmark = pytest.mark.integration

NAME = "routed"
BRANCHES = ("current", "candidate", "popular")
SERVED_BRANCHES = ("current", "candidate")  # popular is inline
UNSEEN_ITEM = 9_999


def request_rows(n_sessions: int, seed: int) -> pd.DataFrame:
    """Shuffled clicks of ``n_sessions`` sessions of their own: one-click sessions (filtered out)
    and, from 7 sessions on, one of unknown items only."""
    rows = toy_session.interactions(n_sessions, seed=seed, first_session=100_000 * seed)
    if n_sessions >= 7:
        last = rows["session_id"] == rows["session_id"].iloc[-1]
        rows.loc[last, "item_id"] = UNSEEN_ITEM
    return rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)


@pytest.fixture(scope="module")
def served(triton_server, pytorch_backend, filtered_toy_workflow):
    workflow = filtered_toy_workflow
    model = toy_session.scripted_model(workflow)
    graph = routed_graphs.routed(workflow, model, candidate_backend="pytorch")
    ensemble = Ensemble(graph, workflow.input_schema)
    result = ensemble.export(triton_server.repository, NAME)
    # BLS calls are invisible to Triton: the branches' ensembles are loaded as models of their own
    assert not (triton_server.repository / f"{NAME}.popular").exists()
    for branch in SERVED_BRANCHES:
        triton_server.load(f"{NAME}.{branch}")
    triton_server.load(NAME)
    return ensemble, graph.op, result


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", [1, 7, 32])
def test_served_answers_equal_in_process_for_sessions_sent_to_different_branches(
    triton_server, served, protocol, n_sessions
):
    ensemble, _, _ = served
    rows = request_rows(n_sessions, seed=n_sessions)
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    answer = Client(url, protocol=protocol).infer(NAME, rows)
    expected = ensemble.transform(rows)
    assert_frames_equal(answer, expected)
    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))
    if n_sessions == 32:
        assert set(answer["branch"]) == set(BRANCHES)
        assert (answer["branch_error"] == "").all()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_async_client_answers_what_client_answers(triton_server, served, protocol):
    requests = [request_rows(sessions, seed=sessions) for sessions in (1, 7, 64)]
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    assert_async_client_answers_as_client(url, protocol, NAME, requests)


def test_each_branch_and_variant_is_counted_and_timed(triton_server, served):
    rows = request_rows(32, seed=5)
    step = f"{NAME}-0-transformworkflow_route"
    time.sleep(2 * FLUSH_INTERVAL_S)  # what earlier requests counted is published by now
    before = scrape(triton_server.metrics_url)
    answer = Client(triton_server.grpc_url).infer(NAME, rows)
    expected = answer.groupby(["branch", "variant"]).size()
    after = published(triton_server, step, before)
    for (branch, variant), sessions in expected.items():
        labels = {"model": step, "branch": branch, "variant": variant}
        got = value(after, "mts_sessions_total", **labels) or 0
        assert got - (value(before, "mts_sessions_total", **labels) or 0) == sessions
    assert value(after, "mts_sessions_total", model=step, branch="") is None  # none counted twice
    for branch in BRANCHES:
        assert value(after, "mts_branch_calls_total", model=step, branch=branch) > 0
        assert value(after, "mts_branch_seconds_total", model=step, branch=branch) > 0


def published(triton_server, step: str, before: str, timeout_s: float = 15.0) -> str:
    """The metrics once the step published one more request than in ``before`` (it publishes
    every second)."""
    deadline = time.monotonic() + timeout_s
    wanted = (value(before, "mts_requests_total", model=step) or 0) + 1
    while True:
        text = scrape(triton_server.metrics_url)
        if value(text, "mts_requests_total", model=step) == wanted or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_new_weights_take_effect_with_a_reload_under_load_without_a_failed_request(
    triton_server, served
):
    ensemble, route, _ = served
    requests = [request_rows(n, seed=40 + n) for n in (1, 32, 7, 32)]
    before = [ensemble.transform(rows) for rows in requests]
    route.set_weights({"current": 0.8, "candidate": 0.2})
    after = [ensemble.transform(rows) for rows in requests]
    assert any(not a["variant"].equals(b["variant"]) for a, b in zip(before, after, strict=True))
    urls = {"grpc": triton_server.grpc_url, "http": triton_server.http_url}
    with Traffic(urls, NAME, requests, list(zip(before, after, strict=True))) as load:
        load.wait_for(40)
        step = set_weights(triton_server.repository, NAME, {"current": 0.8, "candidate": 0.2})
        triton_server.reload(step)
        load.wait_for(40)
    assert load.errors == [], f"{len(load.errors)} of {load.total} failed, e.g. {load.errors[:3]}"
    assert load.mismatches == [], f"{len(load.mismatches)} answers match neither weighting"
    client = Client(triton_server.grpc_url)
    for rows, expected in zip(requests, after, strict=True):
        assert_frames_equal(client.infer(NAME, rows), expected)
    verify_export(triton_server.repository, NAME)  # not exported again: its files are as they were


def test_ten_thousand_sessions_split_as_weighed_and_keep_their_variant(triton_server, served):
    # after the reload above: 80 % current, 20 % candidate
    sessions = np.arange(3_000_000, 3_010_000)
    rows = pd.DataFrame(
        {
            "session_id": np.repeat(sessions, 2),
            "item_id": 500 + (np.arange(2 * len(sessions)) % toy_session.N_ITEMS),
            "category": 0,
            "timestamp": np.tile([0, 10], len(sessions)),
        }
    )
    rows["category"] = rows["item_id"] % 7
    answer = Client(triton_server.grpc_url).infer(NAME, rows)
    share = answer["variant"].value_counts(normalize=True)
    assert abs(share["current"] - 0.8) <= 0.02, share
    assert abs(share["candidate"] - 0.2) <= 0.02, share
    # again, in another order and in requests of 1,000 clicks: every session keeps its variant
    shuffled = rows.sample(frac=1.0, random_state=1).sort_values("session_id", kind="stable")
    again = Client(triton_server.http_url, protocol="http", max_rows_per_request=1_000).infer(
        NAME, shuffled.iloc[::-1]
    )
    variant = dict(zip(answer["session_id"], answer["variant"], strict=True))
    assert len(again) == len(sessions)
    assert all(variant[s] == v for s, v in zip(again["session_id"], again["variant"], strict=True))


def test_an_unloaded_branch_leaves_the_other_sessions_answered_and_its_own_to_the_fallback(
    triton_server, served, filtered_toy_workflow
):
    ensemble, _, _ = served
    workflow = filtered_toy_workflow
    rows = request_rows(32, seed=9)
    expected = ensemble.transform(rows)
    popular = Ensemble(
        workflow.input_schema.column_names
        >> TransformWorkflow(workflow)
        >> MostPopular(routed_graphs.popularity(workflow), routed_graphs.K)
        >> DecodeItemIds(workflow),
        workflow.input_schema,
    )
    triton_server.unload(f"{NAME}.candidate")
    try:
        answer = Client(triton_server.grpc_url).infer(NAME, rows)
    finally:
        triton_server.load(f"{NAME}.candidate")
    candidate = (expected["branch"] == "candidate").to_numpy()
    assert candidate.any()
    assert (~candidate).any()
    assert_frames_equal(
        answer[~candidate].reset_index(drop=True), expected[~candidate].reset_index(drop=True)
    )
    assert (answer["branch"][candidate] == "popular").all()
    assert (answer["variant"][candidate] == "candidate").all()
    assert (
        answer["branch_error"][candidate]
        .str.contains(f"branch 'candidate' failed: .*'{NAME}.candidate'")
        .all()
    )
    for session in answer["session_id"][candidate]:
        alone = popular.transform(rows[rows["session_id"] == session])
        got = answer[answer["session_id"] == session]
        np.testing.assert_array_equal(got["item_ids"].iloc[0], alone["item_ids"].iloc[0])
        np.testing.assert_array_equal(got["item_scores"].iloc[0], alone["item_scores"].iloc[0])
