"""Batch scoring against the other ways to answer a whole dataset: 500,000 clicks of the session
example (its workflow and a Transformers4Rec XLNet trained one epoch, exported mixed: the model,
TopK and decoding on libtorch) answered

- by ``score_dataset`` on a local Dask cluster of 1 and then 2 worker processes (one thread each),
  from parquet files of the click log to parquet files of answers;
- by a loop over ``Ensemble.transform`` in this process, 1,000 sessions per call;
- by one ``Client`` sending 1,000-session requests to the same export on tritonserver.

    ./run bench --only scoring [--clicks 500000] [--backend pytorch|python]

Reports sessions/s (the whole call: for Dask, reading, the input's digest, the shuffle by session,
loading the ensemble on each worker, scoring and writing; also its scoring phase alone) and peak
memory (RSS of each worker process; of this process for the loop; of tritonserver and its stubs
for the served path), the CPU other processes took meanwhile, the load average, and the targets:
2 workers at least 1.6 x 1 worker, 1 worker at least as fast as the served client. Checks that
every path's answers are equal bit for bit. Writes results/scoring.{json,md}.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(REPOSITORY_ROOT))

import argparse
import json
import math
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import psutil

from benchmarks.environment import OtherCpuLoad, cpu_seconds, describe_machine
from benchmarks.memory import PeakServerMemory
from benchmarks.systems import project_ensemble
from benchmarks.workload import build_workload
from examples.session_based import data
from merlin_torch_serving import Client, LocalExecutor, TritonServer, score_dataset

RESULTS_DIR = REPOSITORY_ROOT / "benchmarks" / "results"
MODEL = "session_recs"
CLICKS = 500_000
SESSIONS_PER_REQUEST = 1_000
INPUT_FILES = 10
WORKERS = (1, 2)
#: targets of the run: 2 workers against 1, and 1 worker against the served client
SCALING_TARGET = 1.6
SERVED_TARGET = 1.0
#: the machine is shared: each path is measured this many times, and its fastest run reported
ROUNDS = 2
#: a 1,000-session request takes about half a second; a busy shared machine may make it minutes
REQUEST_TIMEOUT_S = 600.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench --only scoring", description=__doc__)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--clicks", type=int, default=CLICKS)
    parser.add_argument("--backend", choices=("pytorch", "python"), default="pytorch")
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help="measure every path this many times and report its fastest (default %(default)s)",
    )
    arguments = parser.parse_args(argv)
    machine = describe_machine(REPOSITORY_ROOT)
    load_before = os.getloadavg()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-scoring-") as scratch:
        work = Path(scratch)
        _say(f"training the example's model and fitting its workflow (load {load_before})")
        workload = build_workload(work, session_counts=(), progress=False)
        clicks = click_log(arguments.clicks)
        sessions = int(clicks["session_id"].nunique())
        folder = _write_click_log(clicks, work / "clicks")
        _say(f"{len(clicks):,} clicks of {sessions:,} sessions in {INPUT_FILES} parquet files")
        ensemble = project_ensemble(workload, arguments.backend)
        ensemble.export(work / "repository", MODEL)
        batches = _session_batches(clicks, SESSIONS_PER_REQUEST)
        measured: dict[str, list[dict]] = {}
        answers: dict[str, list] = {}
        with (
            TritonServer(work / "repository") as server,
            Client(server.grpc_url, timeout_s=REQUEST_TIMEOUT_S) as client,
        ):
            client.wait_until_ready(MODEL)
            client.infer(MODEL, batches[0])  # the first request pays for lazy start-up
            paths: dict[str, Callable[[int], dict]] = {
                "loop": lambda _: _loop(ensemble, batches, sessions, answers),
                "served": lambda _: _served(client, server.pid, batches, sessions, answers),
                **{
                    f"dask-{workers}": lambda round_, workers=workers: _dask(
                        work, folder, workers, sessions, round_
                    )
                    for workers in WORKERS
                },
            }
            for round_ in range(arguments.rounds):
                # every other round in the opposite order, so that no path always follows another
                for key in list(paths)[:: 1 if round_ % 2 == 0 else -1]:
                    measured.setdefault(key, []).append(paths[key](round_))
        rows = {key: _fastest(runs) for key, runs in measured.items()}
        _check_equal(work, answers["loop"], answers["served"])
    record = {
        "machine": machine,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "minutes": round((time.perf_counter() - began) / 60, 1),
        "clicks": len(clicks),
        "sessions": sessions,
        "backend": arguments.backend,
        "sessions_per_request": SESSIONS_PER_REQUEST,
        "rounds": arguments.rounds,
        "rows": rows,
        "targets": _targets(rows),
    }
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    (arguments.output_dir / "scoring.json").write_text(json.dumps(record, indent=1))
    report = _markdown(record)
    (arguments.output_dir / "scoring.md").write_text(report)
    print(report, flush=True)
    return 0


def click_log(clicks: int) -> pd.DataFrame:
    """About ``clicks`` clicks of whole sessions of the example's catalog (the model's), in time
    order as a click log has them: sessions that overlap in time are interleaved."""
    mean_length = 5.5  # of generate_interactions' sessions, about
    generated = data.generate_interactions(n_sessions=math.ceil(1.2 * clicks / mean_length))
    lengths = generated.groupby("session_id", sort=False).size()
    kept = lengths.index[np.cumsum(lengths.to_numpy()) <= clicks]
    log = generated[generated["session_id"].isin(kept)]
    return log.sort_values("timestamp", kind="stable").reset_index(drop=True)


def _write_click_log(clicks: pd.DataFrame, folder: Path) -> Path:
    folder.mkdir()
    for index, part in enumerate(np.array_split(np.arange(len(clicks)), INPUT_FILES)):
        clicks.iloc[part].to_parquet(folder / f"clicks-{index:02d}.parquet", index=False)
    return folder


def _session_batches(clicks: pd.DataFrame, per_batch: int) -> list[pd.DataFrame]:
    """The clicks of ``per_batch`` sessions at a time, sessions in order of first click."""
    order = pd.unique(clicks["session_id"])
    batch_of = pd.Series(np.arange(len(order)) // per_batch, index=order)
    numbers = batch_of[clicks["session_id"]].to_numpy()
    return [part.reset_index(drop=True) for _, part in clicks.groupby(numbers, sort=True)]


def _loop(ensemble, batches: list[pd.DataFrame], sessions: int, answers: dict) -> dict:
    answers["loop"], row = _measured(
        "in-process loop",
        lambda: [ensemble.transform(batch, LocalExecutor(1)) for batch in batches],
        sessions,
        lambda: PeakServerMemory(os.getpid()),
    )
    return row


def _served(client, server_pid: int, batches: list[pd.DataFrame], sessions: int, answers) -> dict:
    def server_pids() -> list[int]:
        return [server_pid, *(p.pid for p in psutil.Process(server_pid).children(recursive=True))]

    answers["served"], row = _measured(
        "served, Client",
        lambda: [client.infer(MODEL, batch) for batch in batches],
        sessions,
        lambda: PeakServerMemory(server_pid),
        own_pids=server_pids,
    )
    return row


def _dask(work: Path, clicks: Path, workers: int, sessions: int, round_: int) -> dict:
    from distributed import Client as DaskClient
    from distributed import LocalCluster

    output = work / f"scored-{workers}-{round_}"
    environment = dict(os.environ)  # the cluster's nannies set their workers' variables here
    try:
        with (
            LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            DaskClient(cluster) as dask_client,
        ):
            pids = list(dask_client.run(os.getpid).values())
            result, row = _measured(
                f"Dask, {workers} worker{'s' if workers > 1 else ''}",
                lambda: score_dataset(
                    work / "repository", clicks, output, client=dask_client, progress=_progress
                ),
                sessions,
                lambda: PeakEachMemory(pids),
                own_pids=lambda: pids,
            )
    finally:
        os.environ.clear()
        os.environ.update(environment)
    if result.sessions != sessions:
        raise RuntimeError(f"scored {result.sessions} sessions of {sessions}")
    row["scoring_phase_sessions_per_s"] = round(result.sessions_per_s, 1)
    row["partitions"] = result.partitions
    row["output"] = output.name
    return row


def _fastest(runs: list[dict]) -> dict:
    """The run of the most sessions/s, with every run's sessions/s beside it."""
    fastest = max(runs, key=lambda row: row["sessions_per_s"])
    return {**fastest, "sessions_per_s_each_round": [row["sessions_per_s"] for row in runs]}


def _measured(label: str, run: Callable, sessions: int, memory: Callable, own_pids=list):
    """``run()``'s result, and its row: seconds, sessions/s, peak memory (MB), the cores the path
    used (this process and ``own_pids``: workers, or tritonserver and its stubs) and the cores
    other processes took meanwhile."""
    _say(f"{label} ...")
    pids = [os.getpid(), *own_pids()]
    cpu_before = cpu_seconds(pids)
    with memory() as peak, OtherCpuLoad(own_pids) as other:
        started = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - started
    cpu = cpu_seconds(pids) - cpu_before
    row = {
        "label": label,
        "seconds": round(seconds, 2),
        "sessions_per_s": round(sessions / seconds, 1),
        "cores_used": round(cpu / seconds, 2),
        "sessions_per_cpu_s": round(sessions / cpu, 1),
        "peak_rss_mb": [round(b / 2**20) for b in np.atleast_1d(peak.peak_bytes).tolist()],
        "other_cpu_cores": round(other.other_cores, 2),
    }
    _say(f"{label}: {row}")
    return result, row


class PeakEachMemory(PeakServerMemory):
    """The peak RSS of each of ``pids`` (the worker processes), sampled as ``PeakServerMemory``."""

    def __init__(self, pids: list[int]):
        super().__init__(pids[0])
        self.pids = pids
        self.peak_bytes = [0] * len(pids)  # type: ignore[assignment]

    def _sample(self) -> None:
        for index, pid in enumerate(self.pids):
            try:
                rss = psutil.Process(pid).memory_info().rss
            except psutil.NoSuchProcess:
                continue
            self.peak_bytes[index] = max(self.peak_bytes[index], rss)  # type: ignore[index]


def _check_equal(work: Path, in_process: list, served: list) -> None:
    """Every path's answers (the last round's), in session order, equal bit for bit."""

    def ordered(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.sort_values("session_id", kind="stable").reset_index(drop=True)

    reference = ordered(pd.concat(served, ignore_index=True))
    candidates = {"in-process loop": ordered(pd.concat(in_process, ignore_index=True))}
    for folder in sorted(work.glob("scored-*")):
        parts = sorted(folder.glob("part-*.parquet"))
        candidates[folder.name] = ordered(pd.concat(map(pd.read_parquet, parts), ignore_index=True))
    for label, frame in candidates.items():
        if list(frame.columns) != list(reference.columns) or len(frame) != len(reference):
            raise RuntimeError(f"{label}: columns or rows differ from the served answers")
        for name in reference.columns:
            got, want = frame[name].to_numpy(), reference[name].to_numpy()
            if want.dtype == object:
                got, want = np.concatenate(list(got)), np.concatenate(list(want))
            np.testing.assert_array_equal(got, want, err_msg=f"{label}, column {name!r}")
    _say("every path's answers equal the served answers bit for bit")


def _targets(rows: dict) -> list[dict]:
    one, two, served = rows["dask-1"], rows["dask-2"], rows["served"]
    scaling = two["sessions_per_s"] / one["sessions_per_s"]
    against_served = one["sessions_per_s"] / served["sessions_per_s"]
    return [
        {
            "target": f"2 workers at least {SCALING_TARGET} x 1 worker (sessions/s)",
            "ratio": round(scaling, 2),
            "met": scaling >= SCALING_TARGET,
        },
        {
            "target": "1 worker at least as fast as the served client path (sessions/s)",
            "ratio": round(against_served, 2),
            "met": against_served >= SERVED_TARGET,
        },
    ]


def _markdown(record: dict) -> str:
    lines = [
        "# Batch scoring",
        "",
        f"{record['clicks']:,} clicks of {record['sessions']:,} sessions, the session example's"
        f" XLNet exported {'mixed (libtorch)' if record['backend'] == 'pytorch' else 'all python'};"
        f" load average before/after {record['load_average_before']} /"
        f" {record['load_average_after']} (2 cores), {record['minutes']} min, commit"
        f" {record['machine']['commit']}. Sessions/s over the whole call (for Dask: reading, the"
        " input's digest, the shuffle by session, loading the ensemble on the workers, scoring,"
        " writing parquet); the served path and the loop send"
        f" {record['sessions_per_request']:,} sessions at a time. Each path was measured"
        f" {record['rounds']} times, in alternating order; the table shows its fastest run.",
        "",
        "| path | seconds | sessions/s | each round | scoring phase sessions/s | cores used |"
        " sessions per CPU s | peak RSS MB | other CPU |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in record["rows"].values():
        lines.append(
            f"| {row['label']} | {row['seconds']} | {row['sessions_per_s']:,} |"
            f" {', '.join(f'{x:,}' for x in row['sessions_per_s_each_round'])} |"
            f" {row.get('scoring_phase_sessions_per_s', '')} | {row['cores_used']} |"
            f" {row['sessions_per_cpu_s']:,} |"
            f" {', '.join(map(str, row['peak_rss_mb']))} | {row['other_cpu_cores']} |"
        )
    lines += [
        "",
        "Cores used and sessions per CPU second: of this process (the loop; the client; the Dask"
        " scheduler and client) and of the worker processes or of tritonserver and its stubs."
        " Peak RSS: per worker process (Dask), this process (loop: it also holds the clicks and"
        " the training run), tritonserver and its stubs (served). Other CPU: cores other"
        " processes took meanwhile. Targets:",
        "",
    ]
    for target in record["targets"]:
        lines.append(
            f"- {target['target']}: x{target['ratio']} ({'met' if target['met'] else 'NOT met'})"
        )
    one, two = record["rows"]["dask-1"], record["rows"]["dask-2"]
    lines += [
        "",
        f"2 workers used {two['cores_used']} cores where 1 used {one['cores_used']}, while other"
        f" processes took {two['other_cpu_cores']} and {one['other_cpu_cores']}; per CPU second"
        f" they scored x{two['sessions_per_cpu_s'] / one['sessions_per_cpu_s']:.2f} as many"
        " sessions as 1 worker.",
    ]
    return "\n".join(lines) + "\n"


def _progress(state) -> None:
    if state.done in (state.skipped, state.partitions) or state.done % 5 == 0:
        _say("  " + state.line())


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
