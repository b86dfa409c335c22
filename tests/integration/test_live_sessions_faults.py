"""A served live-session graph whose store stops (Redis) or stalls (the embedded store's write
lock held by another process) while it serves: every click is answered from the request alone,
the health reports say the store does not answer, the metrics count the clicks not stored, and
once the store is back the sessions' histories are back."""

from __future__ import annotations

import sqlite3
import time

import pytest

from merlin_torch_serving import Client
from merlin_torch_serving.stores import EmbeddedSettings, RedisSettings
from tests.integration.test_metrics import scrape, value
from tests.live_graphs import ANSWER_COLUMNS, clicks_of, live_ensemble, plain_ensemble, replay
from tests.redis_fixtures import fresh_redis_server
from tests.served import assert_frames_equal, frames_equal

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.3
RETRY_AFTER_S = 0.3


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory):
    """A redis-server of this module's own, which its tests stop."""
    with fresh_redis_server(tmp_path_factory.mktemp("faults_redis")) as server:
        yield server


@pytest.fixture(scope="module")
def stores(own_redis, tmp_path_factory):
    return {
        "redis": RedisSettings(own_redis.url, timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S),
        "embedded": EmbeddedSettings(
            str(tmp_path_factory.mktemp("faults_store")), timeout_s=TIMEOUT_S
        ),
    }


@pytest.fixture(scope="module")
def models(triton_server, stores, toy_workflow, toy_model):
    names = {}
    for kind, store in stores.items():
        names[kind] = f"live_faults_{kind}"
        live_ensemble(
            toy_workflow, toy_model, store, block_list=True, retry_after_s=RETRY_AFTER_S
        ).export(triton_server.repository, names[kind])
        triton_server.load(names[kind])
    return names


class Outage:
    """Takes a store away and brings it back: Redis stopped, or the embedded file's write lock
    held by another connection (writers wait out their timeout, then fail)."""

    def __init__(self, kind, own_redis, store):
        self.kind, self.redis, self.store = kind, own_redis, store
        self._holder = None

    def begin(self) -> None:
        if self.kind == "redis":
            self.redis.stop()
        else:
            self._holder = sqlite3.connect(self.store.path, isolation_level=None)
            self._holder.execute("BEGIN EXCLUSIVE")

    def end(self) -> None:
        if self.kind == "redis":
            self.redis.start()
        elif self._holder is not None:
            self._holder.execute("ROLLBACK")
            self._holder.close()
            self._holder = None


def store_steps(reports, model) -> list:
    """The health of the model's steps that call the store (the history's, the block list's)."""
    found = [r for r in reports if r.name.startswith(f"{model}-") and r.services]
    assert found, [r.name for r in reports]
    return found


@pytest.mark.parametrize("kind", ["redis", "embedded"])
def test_a_store_gone_mid_session_leaves_every_click_answered_and_history_comes_back(
    triton_server, models, stores, own_redis, toy_workflow, toy_model, kind
):
    model = models[kind]
    plain = plain_ensemble(toy_workflow, toy_model)
    drawn = clicks_of(12, 7_000_000 + (kind == "redis") * 1000, seed=9)
    lengths = drawn.groupby("session_id")["session_id"].transform("size")
    long = drawn[lengths >= 5]
    chosen = long["session_id"].isin(long["session_id"].unique()[:3])
    clicks = long[chosen].groupby("session_id").head(5)  # three sessions of five clicks
    rounds = list(replay(clicks, 3))
    assert len(rounds) == 5
    grpc = Client(triton_server.grpc_url, retries=0)
    http = Client(triton_server.http_url, "http", retries=0)
    for new, history in rounds[:3]:
        assert_frames_equal(grpc.infer(model, new)[ANSWER_COLUMNS], plain.transform(history))
    assert not any(step.degraded for step in store_steps(triton_server.health(), model))

    outage = Outage(kind, own_redis, stores[kind])
    outage.begin()
    try:
        lost, _ = rounds[3]
        for client in (grpc, http):
            alone = client.infer(model, lost)[ANSWER_COLUMNS]
            assert_frames_equal(alone, plain.transform(lost))  # the request's own clicks only
        for reports in (triton_server.health(), grpc.health()):
            for step in store_steps(reports, model):
                assert step.healthy
                assert step.degraded
                assert not any(service.reachable for service in step.services)
    finally:
        outage.end()

    # back: the next click finds the history stored before the outage (its clicks were lost)
    new, everything = rounds[4]
    kept = plain.transform(everything[everything.groupby("session_id").cumcount() != 3])
    deadline = time.monotonic() + 60
    while not frames_equal(answer := grpc.infer(model, new)[ANSWER_COLUMNS], kept):
        assert time.monotonic() < deadline, answer
        time.sleep(RETRY_AFTER_S)
    assert not any(step.degraded for step in store_steps(triton_server.health(), model))
    deadline = time.monotonic() + 30
    while (value(scrape(triton_server.metrics_url), "mts_unstored_clicks_total") or 0) < 1:
        assert time.monotonic() < deadline, "the clicks not stored were never counted"
        time.sleep(0.3)
    grpc.close()
    http.close()
