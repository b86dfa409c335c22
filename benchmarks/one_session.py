"""One session per request on Transformers4Rec's getting-started example: in-process
``Ensemble.transform`` against the same ensemble served (all python, and mixed with the model on
Triton's pytorch backend; gRPC and HTTP ``Client``),
measured side by side, requests interleaved so that every path meets the same machine load.

    ./run python benchmarks/one_session.py [--rounds 300] [--profile]

In-process runs twice: with ``LocalExecutor()`` (one torch thread, as exports default to) and with
``LocalExecutor(torch_threads=None)`` (the process's torch threads, one per core: how in-process
runs went before). Prints each path's p50 and p90 and its time per operator, the in-process p50
over the best served p50, the CPU that other processes took meanwhile, and with ``--profile`` a
cProfile of each in-process variant.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:
    sys.path.insert(0, str(REPOSITORY_ROOT))

import warnings

for _category in (UserWarning, FutureWarning, DeprecationWarning):
    warnings.filterwarnings("ignore", category=_category)

import argparse
import cProfile
import io
import pstats
import tempfile
import time

import numpy as np
import psutil

from benchmarks.environment import OtherCpuLoad
from merlin_torch_serving import Client, LocalExecutor, TritonServer
from merlin_torch_serving.data import frames
from merlin_torch_serving.graph.plan import REQUEST, Ref, run_calls
from merlin_torch_serving.graph.threads import torch_threads
from tests.official import getting_started
from tests.official.example import one_session_requests, prepare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="timed requests per path")
    parser.add_argument(
        "--profile", action="store_true", help="profile 100 requests of each in-process variant"
    )
    arguments = parser.parse_args(argv)
    executors = {
        "in-process": LocalExecutor(),
        "in-process, all threads": LocalExecutor(torch_threads=None),
    }

    with tempfile.TemporaryDirectory() as work:
        example = prepare(getting_started, str(Path(work) / "categories"))
        ensemble = example.ensemble()
        ensemble.export(Path(work) / "repository", "getting_started")
        # the same graph with the model, TopK, decoding and blanking on libtorch
        example.ensemble(backend="pytorch").export(
            Path(work) / "repository", "getting_started_mixed"
        )
        sessions = one_session_requests(example)
        print(
            f"{psutil.cpu_count()} cores; {len(sessions)} different "
            f"one-session requests of {min(map(len, sessions))} to {max(map(len, sessions))} clicks"
        )
        with TritonServer(Path(work) / "repository", start_timeout_s=300) as server:
            clients = {
                "grpc": Client(server.grpc_url),
                "http": Client(server.http_url, protocol="http"),
            }
            paths = {
                name: lambda frame, e=e: ensemble.transform(frame, e)
                for name, e in executors.items()
            }
            for model, label in (("getting_started", "python"), ("getting_started_mixed", "mixed")):
                paths.update(
                    {
                        f"served {name} {label}": lambda frame, c=c, m=model: c.infer(m, frame)
                        for name, c in clients.items()
                    }
                )
            for send in paths.values():  # warm up on every request once
                for frame in sessions:
                    send(frame)

            def own() -> list[int]:
                return [
                    server.pid,
                    *[p.pid for p in psutil.Process(server.pid).children(recursive=True)],
                ]

            times = {name: [] for name in paths}
            with OtherCpuLoad(own) as load:
                for round_ in range(arguments.rounds):
                    frame = sessions[round_ % len(sessions)]
                    for name, send in paths.items():
                        began = time.perf_counter()
                        send(frame)
                        times[name].append((time.perf_counter() - began) * 1e3)
            print(
                f"{arguments.rounds} requests per path, interleaved; other processes took"
                f" {load.other_cores:.2f} cores (steal {load.steal_cores:.2f}); load average"
                f" {', '.join(f'{x:.2f}' for x in psutil.getloadavg())}"
            )
            for name, values in times.items():
                print(
                    f"  {name:<24} p50 {np.percentile(values, 50):7.2f} ms   p90"
                    f" {np.percentile(values, 90):7.2f} ms"
                )
            served = min(
                np.percentile(values, 50)
                for name, values in times.items()
                if name.startswith("served")
            )
            for name in executors:
                print(
                    f"  {name} p50 / best served p50 ="
                    f" {np.percentile(times[name], 50) / served:.2f}"
                )
        for name, executor in executors.items():
            print(
                f"{name}, median ms per operator: "
                + ", ".join(
                    f"{label} {ms:.2f}"
                    for label, ms in _operator_medians(ensemble, executor, sessions).items()
                )
            )
        if arguments.profile:
            for name, executor in executors.items():
                profile = cProfile.Profile()
                profile.enable()
                for round_ in range(100):
                    ensemble.transform(sessions[round_ % len(sessions)], executor)
                profile.disable()
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(8)
                print(f"--- {name}: 100 requests, by own time\n{text.getvalue()}")
    return 0


def _operator_medians(ensemble, executor, sessions) -> dict[str, float]:
    """Median milliseconds of each operator of the plan, run under the executor's torch threads."""
    samples: dict[str, list[float]] = {}
    with torch_threads(executor.torch_threads):
        for round_ in range(100):
            table = frames.frame_to_table(sessions[round_ % len(sessions)], ensemble.input_schema)
            env = {Ref(REQUEST, name): column for name, column in table.items()}
            for call in ensemble.plan.calls:
                began = time.perf_counter()
                run_calls([call], env, {})
                samples.setdefault(call.op.label, []).append((time.perf_counter() - began) * 1e3)
    return {label: float(np.median(values)) for label, values in samples.items()}


if __name__ == "__main__":
    sys.exit(main())
