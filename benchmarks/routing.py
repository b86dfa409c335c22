"""What routing costs one session: the session example's graph with a route (the model's branch and
a most-popular fallback computed in the route's step, sessions of unknown items sent to the
fallback) against the same graph without it, side by side in one run.

    ./run bench --only routing [--rounds 400]

Mixed (the model on libtorch, which the route's python step calls through BLS) and all python (the
model's branch called through BLS as a python model of its own, or computed inside the route's
step: ``inline``). In-process (``Ensemble.transform``), then served on one tritonserver that holds
all five exports: one client sends one-session requests over gRPC on a connected channel,
pre-serialized, the exports taking turns request by request (the order rotating each round), so
that the machine's other work weighs on all alike. Every session of the requests is answered by
the model's branch, the path the route adds to. Writes results/routing.{json,md}.
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
import time
from collections.abc import Callable

import numpy as np

from benchmarks.bls_floor import THROUGH_BLS, THROUGH_ENSEMBLE, write_bls_floor
from benchmarks.concurrency import RESULTS_DIR
from benchmarks.sweep_clients import grpc_sender
from benchmarks.systems import RESERVED_IDS, TOP_K
from benchmarks.workload import build_workload
from examples.session_based import data
from merlin_torch_serving import (
    AllItemsUnknown,
    DecodeItemIds,
    Ensemble,
    FilteredOut,
    ItemPopularity,
    LocalExecutor,
    MostPopular,
    PredictPytorch,
    Route,
    TopK,
    TransformWorkflow,
    TritonServer,
)
from merlin_torch_serving.data import frames, wire

#: interleaved rounds: each export (or in-process graph) answers one request per round
ROUNDS = 400
WARM_REQUESTS = 20
#: what the issue asks of routing: at most this many ms more than without it, or this ratio
TARGET_MS, TARGET_RATIO = 0.3, 1.10
#: routed export -> (its label, the export without the route it is compared with)
ROUTED = {
    "pytorch-routed": ("mixed: model on libtorch, through BLS", "pytorch-plain"),
    "python-routed": ("all python: model's branch through BLS", "python-plain"),
    "python-inline": ("all python: model's branch inline", "python-plain"),
}


def graphs(workload, popularity, backend: str, inline: bool = False) -> tuple[Ensemble, Ensemble]:
    """The example's graph (as ``systems.project_ensemble`` builds it) without and with a route
    (``inline``: the model's branch computed in the route's step)."""
    workflow = workload.workflow
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)

    def ranked():
        return (
            features
            >> PredictPytorch(workload.session_model, backend=backend)
            >> TopK(TOP_K, seen_items=features["item_id-list"], exclude_ids=list(RESERVED_IDS))
            >> DecodeItemIds(workflow, source_column="item_id")
        )

    plain = Ensemble(features["session_id"] + ranked(), workflow.input_schema)
    popular = (
        features
        >> MostPopular(popularity, TOP_K)
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    route = Route(
        {"model": ranked(), "popular": popular},
        rules=[(FilteredOut(), "popular"), (AllItemsUnknown(), "popular")],
        default="model",
        fallback="popular",
        inline=["popular", "model"] if inline else ["popular"],
    )
    return plain, Ensemble(features >> route, workflow.input_schema)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench --only routing", description=__doc__)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    arguments = parser.parse_args(argv)
    load_before = os.getloadavg()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-routing-") as scratch:
        workload = build_workload(
            Path(scratch), session_counts=(1,), progress=False, requests_per_setting=64
        )
        train, _ = data.split_by_time(data.generate_interactions())
        popularity = ItemPopularity.fit(train, workload.workflow)
        ensembles = {}
        for backend in ("pytorch", "python"):
            plain, routed = graphs(workload, popularity, backend)
            ensembles[f"{backend}-plain"], ensembles[f"{backend}-routed"] = plain, routed
        ensembles["python-inline"] = graphs(workload, popularity, "python", inline=True)[1]
        requests = _model_sessions(workload.requests[1], ensembles["python-routed"])
        print(f"[{time.perf_counter() - began:6.1f} s] {len(requests)} one-session requests")
        in_process = _in_process(ensembles, requests, arguments.rounds)
        print(f"[{time.perf_counter() - began:6.1f} s] in-process: {in_process}")
        repository = Path(scratch) / "repository"
        for name, ensemble in ensembles.items():
            ensemble.export(repository, name)
        write_bls_floor(repository)
        served = _served(repository, ensembles, requests, workload, arguments.rounds)
        print(f"[{time.perf_counter() - began:6.1f} s] served: {served}")
    record = {
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "rounds": arguments.rounds,
        "requests": len(requests),
        "seconds": round(time.perf_counter() - began, 1),
        "p50_ms": {"in-process": in_process, "served, gRPC": served},
    }
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    (arguments.output_dir / "routing.json").write_text(json.dumps(record, indent=1))
    report = _markdown(record)
    (arguments.output_dir / "routing.md").write_text(report)
    print(report, flush=True)
    return 0


def _model_sessions(requests, routed: Ensemble) -> list:
    """The requests whose session the route sends to the model (the path it adds to)."""
    return [frame for frame in requests if routed.transform(frame)["branch"].iloc[0] == "model"]


def _in_process(ensembles: dict, requests: list, rounds: int) -> dict[str, float]:
    executor = LocalExecutor(1)
    calls = {
        name: (lambda i, e=ensemble: e.transform(requests[i % len(requests)], executor))
        for name, ensemble in ensembles.items()
    }
    return _interleaved(calls, rounds)


def _served(repository: Path, ensembles: dict, requests: list, workload, rounds: int) -> dict:
    schema = workload.workflow.input_schema
    arrays = [wire.to_wire(frames.frame_to_table(frame, schema)) for frame in requests]
    with TritonServer(repository, start_timeout_s=300.0) as server:
        senders, closers = {}, []
        for name, ensemble in ensembles.items():
            outputs = [
                wire.response_name(spec.name, schema.column_names)
                for spec in wire.schema_specs(ensemble.output_schema)
            ]
            send, close = grpc_sender(server.grpc_url, name, arrays, outputs)
            senders[name] = lambda i, send=send: _answered(send(i % len(arrays)))
            closers.append(close)
        for name in (THROUGH_ENSEMBLE, THROUGH_BLS):
            floor = [{"X": np.arange(20, dtype=np.int64)}]
            send, close = grpc_sender(server.grpc_url, name, floor, ["Y"])
            senders[name] = lambda i, send=send: _answered(send(0))
            closers.append(close)
        try:
            return _interleaved(senders, rounds)
        finally:
            for close in closers:
                close()


def _answered(answered: bool) -> None:
    if not answered:
        raise RuntimeError("a request failed")


def _interleaved(calls: dict[str, Callable[[int], object]], rounds: int) -> dict[str, float]:
    """p50 ms of each call, the calls taking turns (the order rotating every round)."""
    names = list(calls)
    for name in names:
        for i in range(WARM_REQUESTS):
            calls[name](i)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            calls[name](round_)
            times[name].append((time.perf_counter() - started) * 1000.0)
    return {name: round(statistics.median(values), 3) for name, values in times.items()}


def _markdown(record: dict) -> str:
    lines = [
        "# What routing costs one session",
        "",
        f"Load average before/after: {record['load_average_before']} /"
        f" {record['load_average_after']} (2 cores); {record['rounds']} interleaved rounds over"
        f" {record['requests']} one-session requests answered by the model's branch;"
        f" {record['seconds']} s. p50 in ms.",
        "",
        "| path | routed export | without route | with route | added | ratio | target |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for path, p50 in record["p50_ms"].items():
        for routed_key, (label, plain_key) in ROUTED.items():
            plain, routed = p50[plain_key], p50[routed_key]
            added, ratio = routed - plain, routed / plain
            met = "met" if added <= TARGET_MS or ratio <= TARGET_RATIO else "not met"
            lines.append(
                f"| {path} | {label} | {plain:.3f} | {routed:.3f} | {added:+.3f} |"
                f" x{ratio:.3f} | {met} |"
            )
    served = record["p50_ms"]["served, gRPC"]
    hop, bls = served[THROUGH_ENSEMBLE], served[THROUGH_BLS]
    lines += [
        "",
        f"Target: at most {TARGET_MS} ms more than without the route, or at most"
        f" x{TARGET_RATIO:.2f}. The floor of the hop a route adds, measured in the same rounds: a"
        f" no-op python step handing a vector to a no-op libtorch model answers in {hop:.3f} ms"
        f" through the ensemble and in {bls:.3f} ms through BLS ({bls - hop:+.3f} ms).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
