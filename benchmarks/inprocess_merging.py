"""Concurrent in-process calls, merged or not: the session example's ensemble (all python, in this
process, no server) called by 1, 8 and 32 closed-loop threads, each sending one-session requests
of sessions of its own, with ``LocalExecutor`` (every call runs the plan on its own) and with
``MergingExecutor`` (calls that arrive while a run is under way form the next, merged run).

    ./run bench --only merging

Reports p50, p99, sessions/s and the calls per run side by side, the two executors taking turns in
windows of WINDOW_S (first one, then the other) so that the machine's other work weighs on both
alike, and checks that every
merged answer equals the same request's answer alone. Writes results/inprocess_merging.{json,md}.
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
import tempfile
import threading
import time

import numpy as np
import pandas as pd

from benchmarks.concurrency import RESULTS_DIR
from benchmarks.systems import project_ensemble
from benchmarks.workload import build_workload
from merlin_torch_serving import Ensemble, LocalExecutor, MergingExecutor

CALLERS = (1, 8, 32)
WINDOW_S = 3.0
WINDOWS = 3
#: one-session requests per caller thread (each thread sends its own sessions, in a loop)
REQUESTS_PER_CALLER = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench --only merging", description=__doc__)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    arguments = parser.parse_args(argv)
    load_before = os.getloadavg()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-merging-") as scratch:
        workload = build_workload(
            Path(scratch),
            session_counts=(1,),
            progress=False,
            requests_per_setting=max(CALLERS) * REQUESTS_PER_CALLER,
        )
        ensemble = project_ensemble(workload, "python")
        requests = workload.requests[1]
        _check_answers(ensemble, requests)
        rows = []
        for callers in CALLERS:
            per_caller = [
                requests[i * REQUESTS_PER_CALLER : (i + 1) * REQUESTS_PER_CALLER]
                for i in range(callers)
            ]
            measured: dict[str, list] = {"local": [], "merging": []}
            for window in range(WINDOWS):
                # which executor goes first alternates, so neither always follows the other
                for kind in list(measured)[:: 1 if window % 2 == 0 else -1]:
                    executor = LocalExecutor() if kind == "local" else MergingExecutor()
                    measured[kind].append(
                        _window(ensemble, executor, per_caller, arguments.window_s)
                    )
            for kind, windows in measured.items():
                rows.append(_summary(kind, callers, windows))
                print(rows[-1], flush=True)
    record = {
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "minutes": round((time.perf_counter() - began) / 60, 1),
        "window_s": arguments.window_s,
        "windows": WINDOWS,
        "rows": rows,
    }
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    (arguments.output_dir / "inprocess_merging.json").write_text(json.dumps(record, indent=1))
    report = _markdown(record)
    (arguments.output_dir / "inprocess_merging.md").write_text(report)
    print(report, flush=True)
    return 0


def _check_answers(ensemble: Ensemble, requests: list[pd.DataFrame]) -> None:
    """Every request answered in a merged run equals its answer alone, bit for bit."""
    executor = MergingExecutor()
    sample = requests[:32]
    merged: list = [None] * len(sample)
    start = threading.Barrier(len(sample))

    def call(index: int) -> None:
        start.wait()
        merged[index] = ensemble.transform(sample[index], executor)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(sample))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for request, answer in zip(sample, merged, strict=True):
        pd.testing.assert_frame_equal(answer, ensemble.transform(request), check_exact=True)
    if max(executor.run_sizes) < 2:
        raise RuntimeError(f"no calls were merged: runs of {executor.run_sizes} calls")


def _window(ensemble: Ensemble, executor, per_caller: list[list], seconds: float) -> dict:
    """Closed-loop callers for ``seconds``: each sends its requests in turn until time is up."""
    latencies: list[list[float]] = [[] for _ in per_caller]
    start = threading.Barrier(len(per_caller) + 1)
    deadline: list[float] = []

    def caller(index: int) -> None:
        start.wait()
        own, times, sent = per_caller[index], latencies[index], 0
        while time.perf_counter() < deadline[0]:
            began = time.perf_counter()
            ensemble.transform(own[sent % len(own)], executor)
            times.append((time.perf_counter() - began) * 1000.0)
            sent += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(per_caller))]
    for thread in threads:
        thread.start()
    deadline.append(time.perf_counter() + seconds)
    began = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    flat = [t for times in latencies for t in times]
    runs = getattr(executor, "run_sizes", None)
    return {
        "latencies": flat,
        "sessions_per_s": len(flat) / elapsed,
        "calls_per_run": float(np.mean(runs)) if runs else 1.0,
        "largest_run": max(runs) if runs else 1,
    }


def _summary(kind: str, callers: int, windows: list[dict]) -> dict:
    latencies = np.concatenate([w["latencies"] for w in windows])
    return {
        "executor": kind,
        "callers": callers,
        "p50_ms": round(float(np.percentile(latencies, 50)), 3),
        "p99_ms": round(float(np.percentile(latencies, 99)), 3),
        "sessions_per_s": round(float(np.median([w["sessions_per_s"] for w in windows])), 1),
        "calls_per_run": round(float(np.mean([w["calls_per_run"] for w in windows])), 2),
        "largest_run": int(max(w["largest_run"] for w in windows)),
    }


def _markdown(record: dict) -> str:
    lines = [
        "# Concurrent in-process calls, merged or not",
        "",
        f"Load average before/after: {record['load_average_before']} /"
        f" {record['load_average_after']} (2 cores); {record['minutes']} min. The session"
        " example's ensemble (all python) in this process, closed-loop caller threads sending"
        f" one-session requests, {record['windows']} windows of {record['window_s']} s per point,"
        " the executors taking turns; sessions/s is the median window's.",
        "",
        "| executor | callers | p50 ms | p99 ms | sessions/s | calls per run | largest run |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in record["rows"]:
        lines.append(
            f"| {row['executor']} | {row['callers']} | {row['p50_ms']} | {row['p99_ms']} |"
            f" {row['sessions_per_s']} | {row['calls_per_run']} | {row['largest_run']} |"
        )
    by_key = {(row["executor"], row["callers"]): row for row in record["rows"]}
    lines.append("")
    for callers in sorted({row["callers"] for row in record["rows"]}):
        local, merged = by_key[("local", callers)], by_key[("merging", callers)]
        ratio = merged["sessions_per_s"] / local["sessions_per_s"]
        lines.append(
            f"- {callers} callers: sessions/s x{ratio:.2f}"
            f" merged/alone; p50 {local['p50_ms']} -> {merged['p50_ms']} ms, p99"
            f" {local['p99_ms']} -> {merged['p99_ms']} ms"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
