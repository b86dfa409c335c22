"""The answer log on the real tritonserver: every answer of 1, 7 and 64-session requests over gRPC
and HTTP logged once, under the request id Client sent, with the answer's exact items and scores;
a Redis stream, with Redis stopped mid-run; files
published whole and readable while the server writes; a full disk (a real tmpfs) that fails no
request, counts the drops on the metrics endpoint and shows in health; and a server killed with
SIGKILL, restarted, then stopped gracefully: what was lost, and that nothing came twice."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import tritonclient.grpc

from merlin_torch_serving import (
    AnswerLogError,
    Client,
    DecodeItemIds,
    Ensemble,
    LogAnswers,
    ParquetFolder,
    PredictPytorch,
    RedisSettings,
    RedisStream,
    TopK,
    TransformWorkflow,
    TritonServer,
    read_answers,
)
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.export.step_metrics import FLUSH_INTERVAL_S
from tests import toy_session
from tests.answer_logs import fill, logged_routed, small_filesystem
from tests.integration.test_metrics import scrape, value
from tests.redis_fixtures import fresh_redis_server
from tests.served import raw_inputs

pytestmark = pytest.mark.integration

NAME = "logged"
STEP = f"{NAME}-0-transformworkflow_route_loganswers"
FLUSH_S = 0.2
MAX_PENDING = 1000


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    with small_filesystem(tmp_path_factory.mktemp("answer_log_disk"), "16m") as folder:
        yield folder


@pytest.fixture(scope="module")
def served(triton_server, toy_workflow, toy_model, small_disk):
    """The routed toy graph, every branch computed in the route's step, logged into a folder on
    a 16 MB tmpfs (files published at 32 kB)."""
    folder = small_disk / "log"
    ensemble, _ = logged_routed(
        toy_workflow,
        toy_model,
        ParquetFolder(folder, rotate_bytes=32_000),
        inline=("current", "candidate", "popular"),
        flush_interval_s=FLUSH_S,
        max_pending=MAX_PENDING,
    )
    result = ensemble.export(triton_server.repository, NAME)
    assert result.models == [STEP, NAME]
    triton_server.load(NAME)
    yield folder
    triton_server.unload(NAME)


@pytest.fixture(scope="module")
def clients(triton_server):
    """A ``Client`` of the shared server per protocol, for the module's tests (the gRPC one is
    shared by threads)."""
    opened = {
        "grpc": Client(triton_server.grpc_url, "grpc", retries=0),
        "http": Client(triton_server.http_url, "http", retries=0),
    }
    yield opened
    for client in opened.values():
        client.close()


def send(client: Client, rows, request_id: str, model: str = NAME) -> dict:
    """The served answer of ``model`` to ``rows``, sent through ``client`` under ``request_id``:
    one array per output column."""
    return client.infer_columns(model, rows, request_id=request_id)


def logged_under(folder, request_ids, sessions: int, timeout_s: float = 60.0):
    """The log's records of ``request_ids`` once it holds ``sessions`` of them."""
    deadline = time.monotonic() + timeout_s
    while not folder.is_dir() and time.monotonic() < deadline:  # made with the first flush
        time.sleep(0.05)
    while True:
        logged = read_answers(folder)
        mine = logged[logged["request_id"].isin(list(request_ids))]
        if len(mine) >= sessions or time.monotonic() > deadline:
            return mine
        time.sleep(0.1)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", [1, 7, 64])
def test_every_answer_is_logged_once_under_its_request_id_with_its_exact_items_and_scores(
    served, clients, protocol, n_sessions
):
    folder = served
    rows = toy_session.interactions(n_sessions, seed=n_sessions, first_session=10_000 * n_sessions)
    request_id = f"{protocol}-{n_sessions}"
    answer = send(clients[protocol], rows, request_id)
    logged = logged_under(folder, [request_id], n_sessions).set_index("session_id")

    assert sorted(logged.index) == sorted(answer["session_id"].tolist())  # each session once
    for row, session in enumerate(answer["session_id"]):
        record = logged.loc[session]
        np.testing.assert_array_equal(record["item_ids"], answer["item_ids"][row])
        np.testing.assert_array_equal(record["scores"], answer["item_scores"][row])
        assert (record["branch"], record["variant"]) == (
            answer["branch"][row],
            answer["variant"][row],
        )
    assert set(logged["ensemble"]) == {NAME}
    assert set(logged["model"]) == {STEP}
    assert set(logged["ensemble_version"]) == set(logged["model_version"]) == {1}


def test_files_are_published_whole_and_the_log_reads_while_the_server_writes(served, clients):
    folder = served
    rows = toy_session.interactions(7, seed=3, first_session=500_000)
    sent, stop = [], threading.Event()

    def traffic():
        while not stop.is_set() and len(sent) < 400:
            request_id = f"rotation-{len(sent)}"
            send(clients["grpc"], rows, request_id)
            sent.append(request_id)

    thread = threading.Thread(target=traffic)
    thread.start()
    logged_under(folder, [], 0)  # the folder is made with the first flush
    seen = []
    try:
        while thread.is_alive() and len(seen) < 100:
            for path in folder.glob("answers-*.parquet"):
                pq.read_table(path)  # whole, even while the next one is being published
            logged = read_answers(folder)
            keys = list(zip(logged["request_id"], logged["session_id"], strict=True))
            assert len(keys) == len(set(keys))
            seen.append(int(logged["request_id"].str.startswith("rotation-").sum()))
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(120)
    assert seen == sorted(seen)
    assert seen[-1] > seen[0]
    mine = logged_under(folder, sent, 7 * len(sent))
    assert len(mine) == 7 * len(sent)
    published = sorted(folder.glob("answers-*.parquet"))
    assert len(published) >= 2
    assert sum(pq.read_metadata(path).num_rows for path in published) > 0


def test_a_full_disk_fails_no_request_counts_the_drops_and_health_says_so(
    triton_server, served, clients, small_disk
):
    folder = served
    time.sleep(3 * FLUSH_S)  # what earlier tests queued is written: nothing is pending
    before = scrape(triton_server.metrics_url)
    filler = fill(small_disk)
    try:
        requests = [
            toy_session.interactions(64, seed=s, first_session=600_000 + 100 * s) for s in range(20)
        ]
        for index, rows in enumerate(requests):  # 1,280 sessions: the queue holds 1,000
            answer = send(clients["grpc"], rows, f"full-{index}")
            assert len(answer["session_id"]) == 64
        (step,) = [h for h in clients["grpc"].health() if h.name == STEP]
        (log,) = step.services
        assert not log.reachable
        assert "is full" in log.error
        assert step.degraded
        assert step.healthy
        # drops are counted as they happen, failed flushes with the next request
        send(clients["grpc"], requests[0][:1], "full-last")
        assert counted(triton_server, STEP, "mts_answer_log_failed_flushes_total", before) > 0
        dropped = counted(triton_server, STEP, "mts_answer_log_dropped_total", before)
        # a request's answers are queued whole or dropped whole; how many fit depends on what the
        # writer freed around the fill (a journal published just before), so only the whole
        # count is checked: below, every session is in the log or counted as dropped
        assert dropped >= 64
        assert dropped % 64 == 0
    finally:
        filler.unlink()
    sent = 64 * len(requests) + 1
    full = logged_under(
        folder, [f"full-{i}" for i in range(len(requests))] + ["full-last"], sent - dropped
    )
    # what was queued is written once the disk has room again: every answer logged or counted
    assert len(full) + dropped == sent
    assert full.groupby("request_id").size().isin([64, 1]).all()


REDIS_LOGGED = "logged_redis"
REDIS_STEP = f"{REDIS_LOGGED}-0-transformworkflow_route_loganswers"


def test_a_redis_stream_logs_every_answer_and_redis_stopped_fails_no_request(
    triton_server, clients, toy_workflow, toy_model, tmp_path
):
    """The served graph logging to a Redis stream of its own redis-server: answers read back
    exactly; the server stopped: every request answered, the drops counted, health degraded;
    started again: what was queued is written."""
    with fresh_redis_server(tmp_path / "redis") as redis:
        stream = RedisStream(RedisSettings(redis.url, timeout_s=0.5, connect_timeout_s=0.5))
        ensemble, _ = logged_routed(
            toy_workflow,
            toy_model,
            stream,
            inline=("current", "candidate", "popular"),
            flush_interval_s=FLUSH_S,
            max_pending=100,
        )
        ensemble.export(triton_server.repository, REDIS_LOGGED)
        triton_server.load(REDIS_LOGGED)
        try:
            rows = toy_session.interactions(7, seed=21, first_session=700_000)
            answer = send(clients["grpc"], rows, "r-1", REDIS_LOGGED)
            logged = _stream_records(stream, 7).set_index("session_id")
            for row, session in enumerate(answer["session_id"]):
                record = logged.loc[session]
                np.testing.assert_array_equal(record["item_ids"], answer["item_ids"][row])
                np.testing.assert_array_equal(record["scores"], answer["item_scores"][row])
            assert set(logged["request_id"]) == {"r-1"}

            redis.stop()
            before = scrape(triton_server.metrics_url)
            for index in range(20):  # 140 sessions: 98 fit the queue (14 requests), 42 do not
                sent = send(clients["grpc"], rows, f"down-{index}", REDIS_LOGGED)
                assert len(sent["session_id"]) == 7
            (step,) = [h for h in triton_server.health() if h.name == REDIS_STEP]
            assert step.degraded
            assert not step.services[0].reachable
            assert counted(triton_server, REDIS_STEP, "mts_answer_log_dropped_total", before) == 42

            redis.start()
            kept = _stream_records(stream, 7 + 98)
            assert len(kept) == 7 + 98
            assert set(kept["request_id"]) == {"r-1"} | {f"down-{i}" for i in range(14)}
        finally:
            triton_server.unload(REDIS_LOGGED)


def _stream_records(stream, rows: int, timeout_s: float = 60.0):
    """The stream's records once it holds ``rows`` (Redis may still be starting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            logged = read_answers(stream)
        except AnswerLogError:
            logged = None
        if (logged is not None and len(logged) >= rows) or time.monotonic() > deadline:
            return logged
        time.sleep(0.1)


def counted(triton_server, model: str, name: str, before: str, timeout_s: float = 30.0) -> float:
    """How much ``model``'s counter ``name`` grew since ``before``, once its step has published
    everything (it publishes every second: two scrapes a publish apart agree, above zero)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        grown = (value(scrape(triton_server.metrics_url), name, model=model) or 0) - (
            value(before, name, model=model) or 0
        )
        if grown and grown == last:
            return grown
        last = grown
        time.sleep(1.5 * FLUSH_INTERVAL_S)
    return last or 0.0


# ---- a server of its own: killed, restarted, stopped --------------------------------------------

KILLED = "killed"
#: what a SIGKILL may lose: the default flush interval, plus scheduling slack on a loaded machine
FLUSH_DEFAULT_S = 1.0
SLACK_S = 1.0


def test_sigkill_loses_at_most_the_last_flush_interval_nothing_comes_twice_and_a_graceful_stop_loses_nothing(  # noqa: E501
    tmp_path, toy_workflow, toy_model, pytorch_backend
):
    """The model, TopK and DecodeItemIds compiled into one libtorch step, the log a python step
    after it: what it records comes out of Triton's tensors, copied before they are freed."""
    features = toy_workflow.input_schema.column_names >> TransformWorkflow(toy_workflow)
    scripted, inputs, outputs = toy_model
    graph = (
        features
        >> PredictPytorch(scripted, inputs, outputs, backend="pytorch")
        >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
        >> DecodeItemIds(toy_workflow)
        >> LogAnswers(ParquetFolder(tmp_path / "log"), session_ids=features["session_id"])
    )
    ensemble = Ensemble(graph, toy_workflow.input_schema)
    exported = ensemble.export(tmp_path / "repository", KILLED)
    assert [model.rsplit("-", 1)[-1] for model in exported.models[:-1]] == [
        "transformworkflow",
        "predictpytorch_topk_decodeitemids",
        "loganswers",
    ]
    requests = [toy_session.interactions(1, seed=s, first_session=s) for s in range(50)]
    arrays = [wire.to_wire(frames.frame_to_table(r, ensemble.input_schema)) for r in requests]

    server = TritonServer(tmp_path / "repository", start_timeout_s=300.0)
    server.start()
    try:
        with Load(server.grpc_url, arrays) as load:
            load.wait_for(300)
            time.sleep(1.5)
            killed_at = time.time()
            os.killpg(server.pid, signal.SIGKILL)
    finally:
        server.stop()
    acknowledged = {key: at for key, at in load.answered.items() if at < killed_at}

    server = TritonServer(tmp_path / "repository", start_timeout_s=300.0)
    with server:  # the restarted step publishes what the killed one left
        deadline = time.monotonic() + 60
        while list((tmp_path / "log").glob("_open-*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        logged = read_answers(tmp_path / "log")
        keys = set(zip(logged["request_id"], logged["session_id"], strict=True))
        assert len(keys) == len(logged), "a record came twice"
        missing = [at for key, at in acknowledged.items() if key not in keys]
        lost_s = killed_at - min(missing) if missing else 0.0
        print(
            f"SIGKILL: {len(acknowledged)} answers acknowledged, {len(missing)} not logged,"
            f" the oldest of them answered {lost_s:.3f} s before the kill"
        )
        assert lost_s <= FLUSH_DEFAULT_S + SLACK_S
        assert len(missing) < len(acknowledged) / 2

        with Load(server.grpc_url, arrays, prefix="graceful") as load:
            load.wait_for(300)
            server.stop()  # while the traffic flows
    stopped = set(load.answered)
    logged = read_answers(tmp_path / "log")
    keys = list(zip(logged["request_id"], logged["session_id"], strict=True))
    assert len(keys) == len(set(keys))
    assert stopped <= set(keys), "an answer acknowledged before a graceful stop was lost"
    print(f"graceful stop: {len(stopped)} answers acknowledged, every one logged once")
    # each record holds what its session was answered, read out of the libtorch step's tensors
    expected = {int(r["session_id"].iloc[0]): ensemble.transform(r) for r in requests}
    for record in logged.itertuples():
        answer = expected[record.session_id]
        np.testing.assert_array_equal(record.item_ids, answer["item_ids"].iloc[0])
        np.testing.assert_array_equal(record.scores, answer["item_scores"].iloc[0])


class Load:
    """Threads sending one-session requests under ids of their own until stopped; ``answered``:
    (request id, session) -> the time its answer arrived."""

    def __init__(self, url: str, arrays: list, prefix: str = "load", threads: int = 4):
        self.url, self.arrays, self.prefix = url, arrays, prefix
        self.answered: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(i,)) for i in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def wait_for(self, answers: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.answered) < answers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.answered) >= answers

    def _send(self, thread: int) -> None:
        client = tritonclient.grpc.InferenceServerClient(self.url)
        count = 0
        try:
            while not self._stop.is_set():
                arrays = self.arrays[count % len(self.arrays)]
                request_id = f"{self.prefix}-{thread}-{count}"
                count += 1
                inputs = raw_inputs(tritonclient.grpc, arrays)
                try:
                    client.infer(KILLED, inputs, request_id=request_id, client_timeout=10)
                except Exception:  # the server is gone or stopping: not acknowledged
                    time.sleep(0.05)
                    continue
                self.answered[(request_id, int(arrays["session_id"][0]))] = time.time()
        finally:
            client.close()
