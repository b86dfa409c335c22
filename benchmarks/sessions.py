"""What a live session costs: the session example's graph (model on libtorch, the rest python)
answering one new click with the session's history kept in a store, against the same graph
answering a request of the session's whole history, side by side in one run.

    ./run bench --only sessions [--rounds 400] [--seconds 12] [--instances 1]

One tritonserver holds three exports: the stateless graph, and the graph headed by
``SessionHistory`` on the embedded store (SQLite in a folder) and on Redis (a local redis-server
on loopback, started here). The held-out sessions are replayed click by click: each round takes the
next click and sends, in a rotating order, the whole history so far to the stateless graph and the
click alone to each live graph, every request through ``Client`` over gRPC. Then 32 clients send
clicks at once (each its own sessions) for a fixed time, to each graph in turn: sessions per
second. Writes results/sessions.{json,md}.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(REPOSITORY_ROOT))

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

import pandas as pd

from benchmarks.concurrency import RESULTS_DIR
from benchmarks.workload import MAX_SEQUENCE_LENGTH, RESERVED_IDS, TOP_K, build_workload
from examples.live_sessions.redis_server import RedisServer
from examples.session_based import data
from merlin_torch_serving import (
    Client,
    DecodeItemIds,
    EmbeddedSettings,
    Ensemble,
    ModelOptions,
    PredictPytorch,
    RedisSettings,
    SessionHistory,
    TopK,
    TransformWorkflow,
    TritonServer,
)
from merlin_torch_serving.backends.pytorch_build import BUILD_COMMAND, built_for_running_torch

ROUNDS = 400
WARM_REQUESTS = 20
CLIENTS = 32
SECONDS = 12.0
SLICES = 3
#: what a one-click request may add to the whole-history request's p50, per store (ms)
TARGETS_MS = {"embedded": 0.3, "redis": 0.5}
STATELESS = "stateless"


def graph(workload, history: SessionHistory | None) -> Ensemble:
    workflow = workload.workflow
    head = history if history is not None else workflow.input_schema.column_names
    features = head >> TransformWorkflow(workflow)
    ranked = (
        features
        >> PredictPytorch(workload.session_model, backend="pytorch")
        >> TopK(TOP_K, seen_items=features["item_id-list"], exclude_ids=list(RESERVED_IDS))
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    return Ensemble(features["session_id"] + ranked, workflow.input_schema)


def replayed(clicks: pd.DataFrame) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """(the click alone, the session's clicks up to it) for every click, sessions interleaved as
    a site's visitors click: the first click of every session, then the second, ..."""
    sessions = [rows.reset_index(drop=True) for _, rows in clicks.groupby("session_id")]
    pairs = []
    for step in range(max(len(rows) for rows in sessions)):
        for rows in sessions:
            if len(rows) > step:
                pairs.append((rows.iloc[[step]].reset_index(drop=True), rows.iloc[: step + 1]))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench --only sessions", description=__doc__)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--seconds", type=float, default=SECONDS, help="of each 32-client run")
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="instances of every step of the three exports (ModelOptions.instance_count)",
    )
    arguments = parser.parse_args(argv)
    if built_for_running_torch() is None:
        print(
            "error: the graph's model runs on Triton's pytorch backend, which is not built for"
            f" this torch; build it with `./run {BUILD_COMMAND} --sources PATH`",
            file=sys.stderr,
        )
        return 1
    load_before = os.getloadavg()
    began = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {message}", flush=True)

    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-sessions-") as scratch:
        scratch_dir = Path(scratch)
        workload = build_workload(
            scratch_dir, session_counts=(1,), progress=False, requests_per_setting=1
        )
        _, held_out = data.split_by_time(data.generate_interactions())
        clicks = held_out[list(data.INTERACTION_COLUMNS)]
        pairs = replayed(clicks)
        say(f"{len(pairs)} clicks of {clicks['session_id'].nunique()} held-out sessions")
        with RedisServer(scratch_dir / "redis") as redis:
            stores = {
                "embedded": EmbeddedSettings(str(scratch_dir / "store")),
                "redis": RedisSettings(redis.url),
            }
            repository = scratch_dir / "repository"
            options = ModelOptions(instance_count=arguments.instances)
            graph(workload, None).export(repository, STATELESS, options=options)
            for kind, store in stores.items():
                history = SessionHistory(
                    store, workload.workflow.input_schema, max_clicks=MAX_SEQUENCE_LENGTH
                )
                graph(workload, history).export(repository, kind, options=options)
            with TritonServer(repository, start_timeout_s=300.0) as server:
                say("served; one-click requests against whole-history requests")
                latency = _latency(server.grpc_url, pairs, arguments.rounds)
                say(f"p50 ms: {latency}")
                # clicks the latency rounds did not send: every one is new to the live graphs
                fresh = pairs[WARM_REQUESTS + arguments.rounds :] or pairs
                throughput = _throughput(server.grpc_url, fresh, arguments.seconds, say)
    record = {
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "rounds": arguments.rounds,
        "clients": CLIENTS,
        "instances": arguments.instances,
        "seconds_per_throughput_run": arguments.seconds,
        "seconds": round(time.perf_counter() - began, 1),
        "p50_ms": latency,
        "sessions_per_s": throughput,
    }
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    stem = "sessions" if arguments.instances == 1 else f"sessions-{arguments.instances}instances"
    (arguments.output_dir / f"{stem}.json").write_text(json.dumps(record, indent=1))
    report = _markdown(record)
    (arguments.output_dir / f"{stem}.md").write_text(report)
    print(report, flush=True)
    return 0


def _latency(url: str, pairs: list, rounds: int) -> dict[str, float]:
    """p50 ms of each graph through ``Client``, taking turns request by request."""
    names = [STATELESS, *TARGETS_MS]
    times: dict[str, list[float]] = {name: [] for name in names}
    with Client(url, retries=0) as client:
        for index in range(WARM_REQUESTS + rounds):
            alone, history = pairs[index % len(pairs)]
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                client.infer(name, history if name == STATELESS else alone)
                if index >= WARM_REQUESTS:
                    times[name].append((time.perf_counter() - started) * 1000.0)
    return {name: round(statistics.median(values), 3) for name, values in times.items()}


def _throughput(url: str, pairs: list, seconds: float, say) -> dict[str, float]:
    """Sessions answered per second by each graph while ``CLIENTS`` clients send clicks, each
    client the clicks of its own sessions (the whole history to the stateless graph). The graphs
    take turns in ``SLICES`` slices of the time each, the order rotating, so that the machine's
    other work weighs on all alike."""
    by_client: list[list] = [[] for _ in range(CLIENTS)]
    for alone, history in pairs:
        by_client[int(alone["session_id"].iloc[0]) % CLIENTS].append((alone, history))
    names = [STATELESS, *TARGETS_MS]
    answered = dict.fromkeys(names, 0)
    elapsed = dict.fromkeys(names, 0.0)
    # where each client is in its clicks, per graph: a live graph sees each click once
    positions = {name: [0] * CLIENTS for name in names}
    for turn in range(SLICES):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            count, took = _sessions_answered(
                url, name, by_client, seconds / SLICES, positions[name]
            )
            answered[name] += count
            elapsed[name] += took
    results = {name: round(answered[name] / elapsed[name], 1) for name in names}
    say(f"sessions/s with {CLIENTS} clients: {results}")
    return results


def _sessions_answered(
    url: str, name: str, by_client: list[list], seconds: float, positions: list[int]
) -> tuple[int, float]:
    """(requests answered, seconds taken) of one slice: every client sends without pause, each
    going on from where its previous slices left its sessions."""
    answered, errors = [0] * len(by_client), []
    start, stop = threading.Barrier(len(by_client) + 1), threading.Event()

    def send(index: int) -> None:
        mine = by_client[index]
        with Client(url, retries=0) as client:
            start.wait()
            while not stop.is_set():
                alone, history = mine[positions[index] % len(mine)]
                try:
                    client.infer(name, history if name == STATELESS else alone)
                    answered[index] += 1
                except Exception as error:
                    errors.append(f"{type(error).__name__}: {error}")
                positions[index] += 1

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(by_client))]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(120)
    took = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"{len(errors)} requests to {name!r} failed: {errors[:3]}")
    return sum(answered), took


def _markdown(record: dict) -> str:
    p50, rate = record["p50_ms"], record["sessions_per_s"]
    whole = p50[STATELESS]
    lines = [
        "# What a live session costs",
        "",
        f"Load average before/after: {record['load_average_before']} /"
        f" {record['load_average_after']} (2 cores); {record['rounds']} rounds, each click of the"
        f" held-out sessions in turn; {record['seconds']} s. gRPC through `Client`; the model on"
        f" libtorch, the rest python; {record['instances']} instance(s) of every step.",
        "",
        "| graph | request | p50 ms | added | target | met | sessions/s, 32 clients |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: |",
        f"| stateless | the session's whole history | {whole:.3f} | | | | {rate[STATELESS]:.1f} |",
    ]
    for kind, target in TARGETS_MS.items():
        added = p50[kind] - whole
        lines.append(
            f"| SessionHistory, {kind} store | the new click | {p50[kind]:.3f} | {added:+.3f} |"
            f" +{target} | {'met' if added <= target else 'not met'} | {rate[kind]:.1f} |"
        )
    lines += [
        "",
        "Target: a one-click request's p50 at most the whole-history request's p50 + 0.3 ms with"
        " the embedded store, + 0.5 ms with Redis on loopback. Sessions per second: 32 clients,"
        f" {record['seconds_per_throughput_run']:g} s per graph in {SLICES} slices taking turns,"
        " each client the clicks of its own sessions.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
