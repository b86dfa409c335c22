"""Concurrency sweep: many users at once, one session each, against the session example exported
six ways (all python, mixed or all libtorch; cross-request batching on or off), in one
tritonserver; then the cold start of each export on a server of its own (the all-libtorch ones on a
server whose backend folder holds the pytorch backend alone).

Run it with ``./run bench-sweep`` (``--quick`` for a smoke run). For every export, protocol and
number of closed-loop clients (1, 8, 32, 64), it reports p50 and p99 latency, sessions per second
and the batches the server formed (Triton's statistics of the step that runs the model: requests
per execution) and the CPU each session took from tritonserver, its python stubs and the client
processes. Then one client alternates between the exports request by request: on this machine one
export's p50 moved from 4 to 8 ms between windows two seconds apart, which drowns a one-client
comparison made window by window. Clients run in two processes of their own (see
``sweep_clients``). The targets at the end compare batching on with off, measured side by side in
this one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:
    sys.path.insert(0, str(REPOSITORY_ROOT))

from benchmarks import server_stats
from benchmarks.concurrency_report import cpu_text, flag, markdown, targets
from benchmarks.environment import BUSY_MACHINE_CORES, OtherCpuLoad, cpu_seconds
from benchmarks.memory import server_processes
from benchmarks.sweep_clients import (
    AlternatingJob,
    ClientJob,
    grpc_sender,
    run_alternating,
    run_clients,
)
from benchmarks.systems import project_ensemble
from benchmarks.workload import build_workload
from merlin_torch_serving import ModelOptions, TritonServer
from merlin_torch_serving.backends import pytorch_backend_directory
from merlin_torch_serving.data import frames, wire

RESULTS_DIR = REPOSITORY_ROOT / "benchmarks" / "results"
CONCURRENCIES = (1, 8, 32, 64)
PROTOCOLS = ("grpc", "http")
CLIENT_PROCESSES = 2  # one per core: more only adds interpreters that compete with the server
EXPORTS = {  # name -> (model backend, workflow backend, batching, what the libtorch step is)
    "python-off": ("python", "python", False, "torchscript"),
    "python-on": ("python", "python", True, "torchscript"),
    "mixed-off": ("pytorch", "python", False, "torchscript"),
    "mixed-on": ("pytorch", "python", True, "torchscript"),
    "libtorch-off": ("pytorch", "pytorch", False, "torchscript"),
    "libtorch-on": ("pytorch", "pytorch", True, "torchscript"),
    # the all-libtorch export compiled ahead of time (a batched one answers request by request)
    "package-off": ("pytorch", "pytorch", False, "package"),
    "package-on": ("pytorch", "pytorch", True, "package"),
}
#: one-session requests of different sessions: each client sends its own (64 clients, 4 each), as
#: many users would; clients that sent the same session at once could not share a merged run
SESSIONS = 256
OUTPUTS = ["session_id__out", "item_ids", "item_scores"]
#: windows per export at every protocol and client count, the exports taking turns
ROUNDS = 3
COLD_REQUESTS = 5
#: a pause after the steady requests: what the first request after it costs tells the price of
#: waking an idle server (its threads, the stub, the caches) from that of a cold one
IDLE_S = 1.0
STEADY_REQUESTS = 60
#: one client alternating between the exports request by request (after the windows): the
#: one-client comparison without the drift between windows seconds apart
ALTERNATING_ROUNDS = 300
#: as ./run bench does: a window or cold start during which other processes or virtual machines
#: took more than BUSY_MACHINE_CORES is measured once more after this pause, the less disturbed
#: attempt kept, and marked `!` if it stayed above
BUSY_PAUSE_S = 3.0


@dataclass
class Point:
    export: str
    protocol: str
    clients: int
    p50_ms: float
    p99_ms: float
    sessions_per_s: float
    requests: int
    failures: int
    mean_batch: float | None  # requests per execution of the step that runs the model
    largest_batch: int | None
    #: process group ("tritonserver", "python stubs", "clients") -> its CPU over the windows
    #: divided by the sessions the server answered in them
    cpu_ms_per_session: dict[str, float]
    #: cores other processes and virtual machines took, the most of any of its windows
    other_cpu_cores: float = 0.0
    #: its windows that were measured twice (the first attempt disturbed)
    repeated_windows: int = 0


@dataclass
class Window:
    """One closed-loop window of one export: the client-side results, and what the server
    answered (Triton's count of the ensemble's requests) and each process group's CPU over it."""

    latencies_ms: list[float]
    failures: int
    answered: int
    cpu_s: dict[str, float]
    other_cores: float  # cores other processes and virtual machines took meanwhile


@dataclass
class ColdStart:
    export: str
    start_to_ready_s: float
    first_request_ms: float
    next_requests_ms: list[float]
    steady_p50_ms: float
    server_first_ms: float  # the ensemble's own time (Triton's statistics), without the client's
    server_steady_mean_ms: float
    after_idle_ms: (
        float  # the first request after IDLE_S without requests, once steady (median of 3)
    )
    #: cores other processes and virtual machines took from ready to the last steady request
    other_cpu_cores: float = 0.0
    attempts: int = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench-sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows, one protocol")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    arguments = parser.parse_args(argv)
    warmup_s, window_s = (0.5, 1.0) if arguments.quick else (1.0, 3.0)
    protocols = PROTOCOLS[:1] if arguments.quick else PROTOCOLS
    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-sweep-") as scratch:
        work = Path(scratch)
        _say("building the session example (workflow, one epoch of XLNet)")
        workload = build_workload(
            work, session_counts=(1,), progress=False, requests_per_setting=SESSIONS
        )
        schema = workload.workflow.input_schema
        repository = work / "repository"
        for export, (backend, workflow_backend, batching, compiled) in EXPORTS.items():
            project_ensemble(workload, backend, workflow_backend, compiled).export(
                repository / export, export, options=ModelOptions(batching=batching)
            )
        plain = [
            wire.to_wire(frames.frame_to_table(frame, schema)) for frame in workload.requests[1]
        ]
        forms = {
            False: plain,
            True: [{k: v[np.newaxis] for k, v in arrays.items()} for arrays in plain],
        }
        cold = [
            _least_disturbed(
                lambda export=export, batching=batching, workflow=workflow: _cold_start(
                    repository / export, export, forms[batching], workflow == "pytorch"
                ),
                lambda start: start.other_cpu_cores,
            )
            for export, (_, workflow, batching, _) in EXPORTS.items()
        ]
        for start, attempts in cold:
            start.attempts = attempts
        points, alternating = _sweep(repository, forms, protocols, warmup_s, window_s)
    record = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "minutes": round((time.time() - started) / 60, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "client_processes": CLIENT_PROCESSES,
        "cores": os.cpu_count(),
        "window_s": window_s,
        "rounds": ROUNDS,
        "points": [asdict(p) for p in points],
        "one_client_alternating_p50_ms": alternating,
        "cold_starts": [asdict(c) for c, _ in cold],
        "alternating_rounds": ALTERNATING_ROUNDS,
        "idle_s": IDLE_S,
        "targets": targets(points, alternating, [c for c, _ in cold], os.cpu_count() or 1, IDLE_S),
    }
    stem = "concurrency-quick" if arguments.quick else "concurrency"
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    (arguments.output_dir / f"{stem}.json").write_text(json.dumps(record, indent=1))
    (arguments.output_dir / f"{stem}.md").write_text(markdown(record))
    print(markdown(record), flush=True)
    return 0


def _sweep(
    repository: Path, forms: dict, protocols, warmup_s: float, window_s: float
) -> tuple[list[Point], dict[str, dict[str, float]]]:
    """Every export in one server (all of them loaded, one measured at a time). The exports take
    turns, ``ROUNDS`` windows each per protocol and client count, so that what else the machine
    runs weighs on all of them alike; a point pools its export's windows. Then, per protocol, one
    client alternating between the exports request by request: their p50s (protocol -> export
    -> ms)."""
    points = []
    all_models = work_repository(repository)
    # started once and reused: a spawned process imports the benchmark's modules before it runs
    context = multiprocessing.get_context("spawn")
    with (
        context.Pool(CLIENT_PROCESSES) as pool,
        TritonServer(all_models, start_timeout_s=600.0) as server,
    ):
        pool.map(_ready, range(CLIENT_PROCESSES))
        processes = {
            "tritonserver": [server.pid],
            "python stubs": [p.pid for p in server_processes(server.pid)[1:]],
            "clients": [p.pid for p in context.active_children()],
        }
        for protocol in protocols:
            url = server.grpc_url if protocol == "grpc" else server.http_url
            for clients in CONCURRENCIES:
                windows = {export: [] for export in EXPORTS}
                batches = {export: [] for export in EXPORTS}
                repeated = dict.fromkeys(EXPORTS, 0)
                for _ in range(ROUNDS):
                    for export, (_, _, batching, _) in EXPORTS.items():

                        def window(
                            export=export,
                            batching=batching,
                            url=url,
                            protocol=protocol,
                            clients=clients,
                        ):
                            before = _step_statistics(server.http_url, export)
                            measured = _closed_loop(
                                pool,
                                (url, server.http_url),
                                protocol,
                                export,
                                forms[batching],
                                clients,
                                (warmup_s, window_s),
                                processes,
                            )
                            return measured, (before, _step_statistics(server.http_url, export))

                        (measured, formed), attempts = _least_disturbed(
                            window, lambda attempt: attempt[0].other_cores
                        )
                        windows[export].append(measured)
                        batches[export].append(formed)
                        repeated[export] += attempts - 1
                for export in EXPORTS:
                    point = _point(
                        export, protocol, clients, windows[export], batches[export], window_s
                    )
                    point.repeated_windows = repeated[export]
                    points.append(point)
        alternating = {}
        for protocol in protocols:
            url = server.grpc_url if protocol == "grpc" else server.http_url
            job = AlternatingJob(
                url,
                protocol,
                [(export, forms[batching]) for export, (_, _, batching, _) in EXPORTS.items()],
                OUTPUTS,
                ALTERNATING_ROUNDS,
                warmup_rounds=20,
            )
            with OtherCpuLoad(
                lambda: [pid for pids in processes.values() for pid in pids]
            ) as other:
                latencies = pool.apply(run_alternating, (job,))
            alternating[protocol] = {
                export: round(float(np.percentile(ms, 50)), 3) for export, ms in latencies.items()
            }
            alternating[protocol]["other CPU"] = round(other.other_cores, 3)
            _say(
                f"one client alternating between the exports, {protocol}: p50 ms "
                f"{alternating[protocol]}"
            )
    ordered = sorted(
        points,
        key=lambda p: (list(EXPORTS).index(p.export), PROTOCOLS.index(p.protocol), p.clients),
    )
    return ordered, alternating


def _point(export, protocol, clients, windows: list[Window], batches, window_s) -> Point:
    latencies = [ms for window in windows for ms in window.latencies_ms]
    failures = sum(window.failures for window in windows)
    answered = sum(window.answered for window in windows)
    cpu_ms = {
        group: round(sum(w.cpu_s[group] for w in windows) * 1000.0 / max(answered, 1), 3)
        for group in windows[0].cpu_s
    }
    formed = [_formed_batches(before, after) for before, after in batches]
    means = [mean for mean, _ in formed if mean is not None]
    largest = [size for _, size in formed if size is not None]
    point = Point(
        export,
        protocol,
        clients,
        round(float(np.percentile(latencies, 50)), 3) if latencies else float("nan"),
        round(float(np.percentile(latencies, 99)), 3) if latencies else float("nan"),
        round(len(latencies) / (window_s * len(batches)), 1),
        len(latencies),
        failures,
        round(float(np.mean(means)), 2) if means else None,
        max(largest, default=None),
        cpu_ms,
        round(max(window.other_cores for window in windows), 3),
    )
    _say(
        f"{export:10s} {protocol:4s} {clients:3d} clients: p50 {point.p50_ms:7.2f} ms, p99 "
        f"{point.p99_ms:7.2f} ms, "
        f"{point.sessions_per_s:7.1f} sessions/s, batches {point.mean_batch} (largest "
        f"{point.largest_batch}), "
        f"CPU ms per session {cpu_text(cpu_ms)}, failures {failures}, other CPU "
        f"{point.other_cpu_cores:.2f}{flag(point.other_cpu_cores)}"
    )
    return point


def work_repository(repository: Path) -> Path:
    """One repository holding every export's models (each export was written on its own)."""
    merged = repository / "all"
    merged.mkdir(exist_ok=True)
    for export in EXPORTS:
        for model in (repository / export).iterdir():
            if not model.name.startswith("."):
                (merged / model.name).symlink_to(model)
    return merged


def _ready(_: int) -> None:
    """Nothing: mapped once so that every client process has started before the first window."""


def _closed_loop(
    pool, urls, protocol, model, requests, clients, timing, watched: dict[str, list[int]]
) -> Window:
    """``clients`` closed-loop clients of ``model`` at ``urls[0]`` for a warm-up and a window
    (``timing``); the server's count of answered requests (read at ``urls[1]``, its HTTP
    endpoint) and the CPU of the ``watched`` process groups are taken at the window's ends."""
    url, http_url = urls
    warmup_s, window_s = timing
    processes = min(CLIENT_PROCESSES, clients)
    start_at = time.time() + 0.5 + warmup_s  # the jobs reach the running processes at once
    stop_at = start_at + window_s
    shares = [
        clients // processes + (1 if i < clients % processes else 0) for i in range(processes)
    ]
    jobs = [
        ClientJob(
            url,
            protocol,
            model,
            requests,
            OUTPUTS,
            share,
            sum(shares[:i]),
            clients,
            start_at,
            stop_at,
        )
        for i, share in enumerate(shares)
    ]
    pending = pool.map_async(run_clients, jobs, chunksize=1)

    def sample() -> tuple[int, dict[str, float]]:
        return (
            _answered(server_stats.snapshot(http_url), model),
            {group: cpu_seconds(pids) for group, pids in watched.items()},
        )

    time.sleep(max(0.0, start_at - time.time()))
    answered_before, cpu_before = sample()
    with OtherCpuLoad(lambda: [pid for pids in watched.values() for pid in pids]) as other:
        time.sleep(max(0.0, stop_at - time.time()))
    answered_after, cpu_after = sample()
    results = pending.get()
    return Window(
        [ms for latencies, _ in results for ms in latencies],
        sum(failures for _, failures in results),
        answered_after - answered_before,
        {group: cpu_after[group] - cpu_before[group] for group in watched},
        round(other.other_cores, 3),
    )


def _least_disturbed(measure, disturbance):
    """``measure()``; when other processes or virtual machines took more than BUSY_MACHINE_CORES
    meanwhile (``disturbance(attempt)``), once more after BUSY_PAUSE_S: (the attempt they
    disturbed least, attempts made)."""
    attempts = [measure()]
    if disturbance(attempts[0]) > BUSY_MACHINE_CORES:
        _say(
            f"other processes or virtual machines took {disturbance(attempts[0]):.2f} cores;"
            f" measuring again in {BUSY_PAUSE_S:g} s"
        )
        time.sleep(BUSY_PAUSE_S)
        attempts.append(measure())
    return min(attempts, key=disturbance), len(attempts)


def _answered(snapshot: dict, model: str) -> int:
    """Requests of ``model`` the server has answered, in a ``server_stats.snapshot``."""
    return snapshot.get(model, {}).get("success", (0, 0))[0]


def _step_statistics(http_url: str, export: str) -> dict:
    """Of the export's step that runs the model (the python step of an all-python export, the
    libtorch one of a mixed export): (executions, requests) and requests per batch size."""
    import tritonclient.http as httpclient

    from merlin_torch_serving.launcher import access

    client = httpclient.InferenceServerClient(http_url)
    try:
        key = access.headers(access.find_admin_key(http_url))
        stats = client.get_inference_statistics(headers=key)["model_stats"]
    finally:
        client.close()
    return {
        entry["name"]: (
            int(entry["execution_count"]),
            int(entry["inference_count"]),
            {
                int(b["batch_size"]): int(b["compute_infer"]["count"])
                for b in entry.get("batch_stats", [])
            },
        )
        for entry in stats
        if entry["name"].startswith(export + "-")
        and "predictpytorch" in entry["name"].split("-")[-1]
    }


def _formed_batches(before: dict, after: dict) -> tuple[float | None, int | None]:
    for name, (executions, inferences, sizes) in after.items():
        ran = executions - before.get(name, (0, 0, {}))[0]
        if ran <= 0:
            return None, None
        served = inferences - before[name][1]
        grown = [size for size, count in sizes.items() if count > before[name][2].get(size, 0)]
        return round(served / ran, 2), max(grown, default=None)
    return None, None


def _cold_start(repository: Path, export: str, requests: list, libtorch_only: bool) -> ColdStart:
    """A server of this export alone: launch to ready, then its first requests one at a time,
    then its steady p50 (gRPC, one session). ``libtorch_only``: the server's backend folder holds
    the pytorch backend alone."""
    launched = time.perf_counter()
    backends = {"backend_directory": pytorch_backend_directory()} if libtorch_only else {}
    with TritonServer(repository, start_timeout_s=600.0, **backends) as server:
        ready = time.perf_counter()
        # connected before timing, requests serialized: the server's cold start, not the client's
        # (a fresh tritonclient process paid 2 to 10 ms more on its first infer here, warm server
        # or not)
        send, close = grpc_sender(server.grpc_url, export, requests, OUTPUTS)

        def timed(index: int) -> float:
            began = time.perf_counter()
            if not send(index % len(requests)):
                raise RuntimeError(f"{export}: request {index} failed")
            return round((time.perf_counter() - began) * 1000.0, 2)

        own = [process.pid for process in server_processes(server.pid)]
        with OtherCpuLoad(lambda: own) as other:
            before = server_stats.snapshot(server.http_url)
            first = [timed(0)]
            after_first = _counted(server.http_url, export, before, 1)
            first += [timed(i) for i in range(1, COLD_REQUESTS)]
            before_steady = server_stats.snapshot(server.http_url)
            steady = [timed(i) for i in range(COLD_REQUESTS, COLD_REQUESTS + STEADY_REQUESTS)]
            after_steady = _counted(server.http_url, export, before_steady, STEADY_REQUESTS)
        idle = []
        for i in range(3):
            time.sleep(IDLE_S)
            idle.append(timed(COLD_REQUESTS + STEADY_REQUESTS + i))
        after_idle = round(float(np.median(idle)), 2)
        close()
    server_first = server_stats.per_request_ms(before, after_first)[export]["request_ms"]
    server_steady = server_stats.per_request_ms(before_steady, after_steady)[export]["request_ms"]
    start = ColdStart(
        export,
        round(ready - launched, 2),
        first[0],
        first[1:],
        round(float(np.median(steady)), 2),
        server_first,
        server_steady,
        after_idle,
        round(other.other_cores, 3),
    )
    _say(
        f"{export}: ready after {start.start_to_ready_s} s; first requests {first} ms; steady p50 "
        f"{start.steady_p50_ms} ms; "
        f"in the server: first {server_first} ms, steady mean {server_steady} ms; after {IDLE_S} "
        f"s idle {after_idle} ms; other CPU {start.other_cpu_cores:.2f}"
        f"{flag(start.other_cpu_cores)}"
    )
    return start


def _counted(http_url: str, export: str, before: dict, requests: int) -> dict:
    """A snapshot of the server's statistics once they count ``requests`` more answered requests
    of ``export`` than ``before`` (Triton may add a request to them just after answering it)."""
    wanted = _answered(before, export) + requests
    for _ in range(100):
        after = server_stats.snapshot(http_url)
        if _answered(after, export) >= wanted:
            return after
        time.sleep(0.02)
    raise RuntimeError(f"{export}: the server's statistics never counted {requests} more requests")


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
