"""Live sessions served by a real tritonserver, on the embedded store and on Redis: requests of new
clicks only, answered as the whole history is (1, 7 and 64 sessions a request, gRPC and HTTP);
requests sent again stored once; eight threads losing no click; a block list changed under load
obeyed within a second with no failed request; a store gone mid-session (Redis stopped, the
embedded store's write lock held elsewhere) answered from the request alone, health degraded,
history back with the store; two servers sharing one Redis answering as one; and the trending
counts the served graphs kept equal to the batch recount of every click they stored."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
import zlib

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import Client, Trending, TritonServer
from merlin_torch_serving.data.vocabulary import CategoryVocabulary
from merlin_torch_serving.stores import open_store
from tests.integration.test_metrics import scrape
from tests.live_graphs import (
    ANSWER_COLUMNS,
    clicks_of,
    live_ensemble,
    plain_ensemble,
    replay,
    store_settings,
)
from tests.redis_fixtures import fresh_redis_server
from tests.served import assert_frames_equal, frames_equal

pytestmark = pytest.mark.integration

KINDS = ("embedded", "redis")
TRENDING = Trending(bucket=1000, window=50, name="served")
#: a store call waits at most this long (ample on a loaded machine: tests compare exactly), and
#: after a failure the store is skipped this long
TIMEOUT_S = 1.0
RETRY_AFTER_S = 0.3


class Served:
    """One exported live graph: its model name, its store, and every click sent to it."""

    def __init__(self, kind: str, store):
        self.kind = kind
        self.model = f"live_{kind}"
        self.store = store
        self.sent: list[pd.DataFrame] = []
        self._lock = threading.Lock()

    def send(self, client: Client, clicks: pd.DataFrame) -> pd.DataFrame:
        answer = client.infer(self.model, clicks)
        with self._lock:
            self.sent.append(clicks)
        return answer[ANSWER_COLUMNS]


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory):
    """A redis-server of this module's own, which a test stops."""
    with fresh_redis_server(tmp_path_factory.mktemp("live_redis")) as server:
        yield server


@pytest.fixture(scope="module")
def served(triton_server, own_redis, toy_workflow, toy_model, tmp_path_factory):
    """Both live graphs, exported into the shared server's repository and loaded."""
    graphs = {}
    for kind in KINDS:
        store = store_settings(
            kind,
            tmp_path_factory.mktemp("live_store"),
            own_redis,
            timeout_s=TIMEOUT_S,
            **({"connect_timeout_s": TIMEOUT_S} if kind == "redis" else {}),
        )
        graph = Served(kind, store)
        live_ensemble(
            toy_workflow,
            toy_model,
            store,
            trending=TRENDING,
            block_list=True,
            retry_after_s=RETRY_AFTER_S,
        ).export(triton_server.repository, graph.model)
        triton_server.load(graph.model)
        graphs[kind] = graph
    return graphs


@pytest.fixture(scope="module")
def plain(toy_workflow, toy_model):
    return plain_ensemble(toy_workflow, toy_model)


def client_for(server, protocol: str) -> Client:
    url = server.grpc_url if protocol == "grpc" else server.http_url
    return Client(url, protocol, retries=0)


def first_session(*labels) -> int:
    """Session ids of a test's own: 100 000 apart for each combination of its parameters."""
    return 100_000 * (1 + zlib.crc32(repr(labels).encode()) % 20_000)


@pytest.mark.parametrize("per_request", [1, 7, 64])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("kind", KINDS)
def test_click_by_click_answers_equal_whole_history_answers(
    triton_server, served, plain, kind, protocol, per_request
):
    graph = served[kind]
    sessions = 2 if per_request == 1 else per_request
    clicks = clicks_of(sessions, first_session(kind, protocol, per_request))
    with client_for(triton_server, protocol) as client:
        for new, history in replay(clicks, per_request):
            assert_frames_equal(graph.send(client, new), plain.transform(history))


@pytest.mark.parametrize("kind", KINDS)
def test_requests_sent_again_and_duplicated_clicks_are_stored_once(
    triton_server, served, plain, kind
):
    graph = served[kind]
    clicks = clicks_of(5, first_session(kind, "again"), seed=1)
    with client_for(triton_server, "grpc") as client:
        for new, history in replay(clicks, 5):
            first = graph.send(client, new)
            assert_frames_equal(graph.send(client, new), first)  # a retry
            doubled = pd.concat([new, new], ignore_index=True)  # a failover's resend inside one
            assert_frames_equal(graph.send(client, doubled), first)
            assert_frames_equal(first, plain.transform(history))
    with open_store(graph.store) as store:
        for session, rows in clicks.groupby("session_id"):
            assert len(store.clicks(str(session))) == len(rows)


@pytest.mark.parametrize("kind", KINDS)
def test_eight_threads_sending_clicks_of_the_same_sessions_lose_none(
    triton_server, served, plain, kind
):
    graph = served[kind]
    clicks = clicks_of(4, first_session(kind, "threads"), seed=2)
    # each click to one of 8 senders, the clicks of every session spread over all of them
    shares = [clicks.iloc[i::8] for i in range(8)]
    start, errors = threading.Barrier(8), []

    def send(index: int) -> None:
        protocol = ("grpc", "http")[index % 2]
        with client_for(triton_server, protocol) as client:
            start.wait()
            for row in range(len(shares[index])):
                try:
                    graph.send(client, shares[index].iloc[[row]])
                except Exception as error:
                    errors.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors[:3]
    with client_for(triton_server, "grpc") as client:
        last = clicks.groupby("session_id").tail(1)  # sent again: it changes nothing
        answer = graph.send(client, last)
    assert_frames_equal(answer, plain.transform(clicks.sort_values("session_id", kind="stable")))


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_list_changed_under_load_is_obeyed_within_a_second_and_fails_no_request(
    triton_server, served, toy_workflow, kind
):
    graph = served[kind]
    clicks = clicks_of(6, first_session(kind, "rules"), seed=3)
    requests = [rows for _, rows in clicks.groupby("session_id")]
    with client_for(triton_server, "grpc") as client:
        before = [graph.send(client, request) for request in requests]
    best = int(np.asarray(before[0]["item_ids"].iloc[0])[0])
    raw = str(CategoryVocabulary.from_workflow(toy_workflow, "item_id").decode([best])[0])
    answers, errors, stop = [], [], threading.Event()

    def load(index: int) -> None:
        with client_for(triton_server, ("grpc", "http")[index % 2]) as client:
            while not stop.is_set():
                for request in requests:  # the same clicks again: the histories stay as they are
                    sent = time.monotonic()
                    try:
                        answers.append((sent, graph.send(client, request)))
                    except Exception as error:
                        errors.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        with open_store(graph.store) as store:
            store.block("blocked", [raw])
            blocked_at = time.monotonic()
            time.sleep(2.5)
            store.unblock("blocked", [raw])
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert not errors, errors[:3]

    def shows(answer) -> bool:
        return best in np.concatenate(answer["item_ids"].to_numpy())

    assert any(shows(a) for sent, a in answers if sent < blocked_at)
    late = [a for sent, a in answers if sent >= blocked_at + 1.0]
    assert late, "no request was answered a second after the change"
    # refresh_s is 0.5: the bound has half a second of headroom for a loaded machine
    assert not any(shows(a) for a in late)


def test_two_servers_sharing_one_redis_answer_a_session_as_one_server_does(
    triton_server, served, plain, tmp_path
):
    graph = served["redis"]
    second = TritonServer(triton_server.repository, model_control="explicit", stop_timeout_s=6.0)
    second.start()
    try:
        second.load(graph.model)
        clicks = clicks_of(3, first_session("two servers"), seed=4)
        clients = [client_for(triton_server, "grpc"), client_for(second, "http")]
        try:
            for turn, (new, history) in enumerate(replay(clicks, 3)):
                answer = graph.send(clients[turn % 2], new)
                assert_frames_equal(answer, plain.transform(history))
        finally:
            for client in clients:
                client.close()
    finally:
        second.stop()


class Outage:
    """Takes a store away and brings it back: Redis stopped (it saves its data as it stops), or
    the embedded file's write lock held by another connection (writers wait out their timeout,
    then fail; readers go on)."""

    def __init__(self, graph: Served, redis):
        self.graph, self.redis = graph, redis
        self._holder: sqlite3.Connection | None = None

    def __enter__(self):
        if self.graph.kind == "redis":
            self.redis.stop()
        else:
            self._holder = sqlite3.connect(self.graph.store.path, isolation_level=None)
            self._holder.execute("BEGIN EXCLUSIVE")
        return self

    def __exit__(self, *exc_info) -> None:
        if self.graph.kind == "redis":
            self.redis.start()
        elif self._holder is not None:
            self._holder.execute("ROLLBACK")
            self._holder.close()


def unstored_clicks(metrics_text: str, model: str) -> float:
    """The clicks the steps of ``model`` answered from the request alone, as scraped."""
    found = re.findall(
        rf'^mts_unstored_clicks_total{{[^}}]*model="{re.escape(model)}-[^"]*"[^}}]*}} (\S+)$',
        metrics_text,
        flags=re.MULTILINE,
    )
    return sum(float(count) for count in found)


def store_steps(reports, model) -> list:
    """The health of the model's steps that call the store (the history's, the block list's)."""
    found = [r for r in reports if r.name.startswith(f"{model}-") and r.services]
    assert found, [r.name for r in reports]
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_gone_mid_session_leaves_every_click_answered_and_history_comes_back(
    triton_server, served, plain, own_redis, kind
):
    graph = served[kind]
    drawn = clicks_of(12, first_session(kind, "outage"), seed=9)
    long = drawn[drawn.groupby("session_id")["session_id"].transform("size") >= 5]
    clicks = long[long["session_id"].isin(long["session_id"].unique()[:3])]
    rounds = list(replay(clicks.groupby("session_id").head(5), 3))  # 3 sessions, 5 clicks each
    grpc, http = client_for(triton_server, "grpc"), client_for(triton_server, "http")
    for new, history in rounds[:3]:
        assert_frames_equal(graph.send(grpc, new), plain.transform(history))
    assert not any(step.degraded for step in store_steps(triton_server.health(), graph.model))

    with Outage(graph, own_redis):
        lost, _ = rounds[3]  # sent while the store is away: answered, never stored
        for client in (grpc, http):
            alone = client.infer(graph.model, lost)[ANSWER_COLUMNS]
            assert_frames_equal(alone, plain.transform(lost))
        for reports in (triton_server.health(), grpc.health()):
            for step in store_steps(reports, graph.model):
                assert step.healthy
                assert step.degraded
                assert not any(service.reachable for service in step.services)

    new, everything = rounds[4]
    kept = plain.transform(everything[everything.groupby("session_id").cumcount() != 3])
    deadline = time.monotonic() + 60
    while not frames_equal(answer := graph.send(grpc, new), kept):  # the same click again
        assert time.monotonic() < deadline, answer
        time.sleep(RETRY_AFTER_S)
    assert not any(step.degraded for step in store_steps(triton_server.health(), graph.model))
    deadline = time.monotonic() + 30  # the step publishes its counts once a second
    while unstored_clicks(scrape(triton_server.metrics_url), graph.model) < 2 * len(lost):
        assert time.monotonic() < deadline, "the clicks not stored were not counted"
        time.sleep(0.3)
    grpc.close()
    http.close()


@pytest.mark.parametrize("kind", KINDS)
def test_trending_counts_the_served_graph_kept_equal_the_batch_recount(served, kind):
    """Last in the module: every click the tests above stored, each counted once."""
    graph = served[kind]
    sent = pd.concat(graph.sent, ignore_index=True).drop_duplicates(ignore_index=True)
    with open_store(graph.store) as store:
        kept = store.trending_counts(TRENDING.name, TRENDING.window)
    assert kept.latest is not None
    assert kept == TRENDING.batch_counts(sent)
