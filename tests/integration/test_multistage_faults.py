"""A served multi-stage pipeline whose Feast feature server stops, or hangs, while it serves: every
request is answered (the features get their defaults, as in-process), the health reports say the
feature server does not answer, and once it is back the features are its own again."""

from __future__ import annotations

import time

import pytest

from examples.multi_stage import feature_store, pipeline
from merlin_torch_serving import Client, Ensemble
from tests.multistage_fixtures import multistage_request
from tests.served import assert_frames_equal, frames_equal

pytestmark = pytest.mark.integration

MODEL = "multistage_faults"
TIMEOUT_S = 0.3
RETRY_AFTER_S = 1.0


@pytest.fixture(scope="module")
def own_feature_server(feature_repository):
    """A feature server of this module's own, which its tests stop and freeze."""
    with feature_store.FeatureServer(feature_repository) as server:
        yield server


@pytest.fixture(scope="module")
def ensemble(triton_server, pytorch_backend, session_workflow, xlnet, ranker, own_feature_server):
    served = Ensemble(
        pipeline.recommendations_graph(
            session_workflow,
            xlnet.eager,
            ranker,
            pipeline.FeatureSource(feast_url=own_feature_server.url, timeout_s=TIMEOUT_S),
            candidates=30,
        ),
        session_workflow.input_schema,
    )
    served.export(triton_server.repository, MODEL)
    triton_server.load(MODEL)
    return served


@pytest.fixture
def rows(session_split, multistage_tables):
    return multistage_request(session_split[1], multistage_tables, 7, seed=17)


def feast_step_health(reports):
    (report,) = [r for r in reports if r.name.startswith(f"{MODEL}-") and r.services]
    return report


def test_a_stopped_feature_server_leaves_every_request_answered_with_defaults_and_health_says_so(
    triton_server, ensemble, own_feature_server, rows
):
    clients = {
        "grpc": Client(triton_server.grpc_url),
        "http": Client(triton_server.http_url, protocol="http"),
    }
    with_features = clients["grpc"].infer(MODEL, rows)
    assert_frames_equal(with_features, ensemble.transform(rows))
    assert not feast_step_health(triton_server.health()).degraded

    own_feature_server.stop()
    try:
        for client in clients.values():
            assert_frames_equal(client.infer(MODEL, rows), ensemble.transform(rows))
        without = clients["http"].infer(MODEL, rows)
        assert not frames_equal(without, with_features)  # the defaults changed the ranking
        for report in (triton_server.health(), clients["grpc"].health()):
            health = feast_step_health(report)
            assert health.healthy
            assert health.degraded
            assert not health.services[0].reachable
            assert own_feature_server.url in health.services[0].url
    finally:
        own_feature_server.start()
    time.sleep(RETRY_AFTER_S + 0.2)  # the step tries the server again after a failure's pause

    assert_frames_equal(clients["grpc"].infer(MODEL, rows), with_features)
    assert not feast_step_health(triton_server.health()).degraded


def test_a_hung_feature_server_costs_one_timeout_and_the_answer_carries_defaults(
    triton_server, ensemble, own_feature_server, rows
):
    client = Client(triton_server.grpc_url)
    with_features = client.infer(MODEL, rows)

    own_feature_server.pause()
    try:
        began = time.perf_counter()
        hung = client.infer(MODEL, rows)
        took_s = time.perf_counter() - began
        assert_frames_equal(hung, ensemble.transform(rows))
    finally:
        own_feature_server.resume()

    assert not frames_equal(hung, with_features)
    # two lookups (items, sessions), each bounded by the timeout, then skipped while it pauses
    assert took_s < 2 * TIMEOUT_S + 2.0
