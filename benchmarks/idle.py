"""What a pause without requests costs the next request: the session example's one-session request
in-process (no server at all), served all-python and served mixed (gRPC, connected channel), and a
pure-Python loop of about the same time that touches almost no memory, each after pauses of 0,
50 ms and 1 s (sleeping, so the machine may idle).

    ./run bench --only idle

Separates what warm-up and the server can fix (their own cold code paths) from what they cannot:
if the in-process request slows down after a pause as much as the served one, the cost is the
machine's (caches refilled after idling), not the server's. Writes results/idle.{json,md}.
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

from benchmarks.concurrency import OUTPUTS, RESULTS_DIR
from benchmarks.sweep_clients import grpc_sender
from benchmarks.systems import project_ensemble
from benchmarks.workload import build_workload
from merlin_torch_serving import LocalExecutor, ModelOptions, TritonServer
from merlin_torch_serving.data import frames, wire

PAUSES_S = (0.0, 0.05, 1.0)
#: requests after each pause length (the median is reported)
REPEATS = 8
WARM_REQUESTS = 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench --only idle", description=__doc__)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    arguments = parser.parse_args(argv)
    load_before = os.getloadavg()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-idle-") as scratch:
        workload = build_workload(
            Path(scratch), session_counts=(1,), progress=False, requests_per_setting=64
        )
        requests = workload.requests[1]
        results["pure-Python loop"] = _after_pauses(lambda i: _python_loop())
        ensemble, executor = project_ensemble(workload, "python"), LocalExecutor(1)
        results["in-process"] = _after_pauses(
            lambda i: ensemble.transform(requests[i % len(requests)], executor)
        )
        schema = workload.workflow.input_schema
        plain = [wire.to_wire(frames.frame_to_table(frame, schema)) for frame in requests]
        for backend, label in (("python", "served, all python"), ("pytorch", "served, mixed")):
            repository = Path(scratch) / backend
            project_ensemble(workload, backend).export(repository, "m", options=ModelOptions())
            with TritonServer(repository) as server:
                send, close = grpc_sender(server.grpc_url, "m", plain, OUTPUTS)
                results[label] = _after_pauses(lambda i, send=send: send(i % len(plain)))
                close()
    record = {
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "repeats": REPEATS,
        "p50_ms_after_pause": results,
    }
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    (arguments.output_dir / "idle.json").write_text(json.dumps(record, indent=1))
    report = _markdown(record)
    (arguments.output_dir / "idle.md").write_text(report)
    print(report, flush=True)
    return 0


def _after_pauses(request: Callable[[int], object]) -> dict[str, float]:
    """Median ms of ``request`` after each pause, once warm."""
    for i in range(WARM_REQUESTS):
        request(i)
    medians = {}
    sent = WARM_REQUESTS
    for pause in PAUSES_S:
        times = []
        for _ in range(REPEATS):
            if pause:
                time.sleep(pause)
            began = time.perf_counter()
            request(sent)
            times.append((time.perf_counter() - began) * 1000.0)
            sent += 1
        medians[f"{pause:g} s"] = round(statistics.median(times), 2)
    return medians


def _python_loop() -> int:
    total = 0
    for i in range(60_000):
        total += i * i
    return total


def _markdown(record: dict) -> str:
    pauses = [f"{p:g} s" for p in PAUSES_S]
    lines = [
        "# The request after a pause",
        "",
        f"Load average before/after: {record['load_average_before']} /"
        f" {record['load_average_after']} (2 cores). p50 ms of {record['repeats']} requests after"
        " each pause (one session; gRPC on a connected channel for the served ones).",
        "",
        "| request | " + " | ".join(f"after {p}" for p in pauses) + " | x after 1 s |",
        "| --- | " + " | ".join("---:" for _ in pauses) + " | ---: |",
    ]
    for label, medians in record["p50_ms_after_pause"].items():
        cells = " | ".join(str(medians[p]) for p in pauses)
        lines.append(f"| {label} | {cells} | x{medians['1 s'] / medians['0 s']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
