"""``./run bench``: build the session-based example once, then measure side by side the in-process
limit, the Triton floor, this project's all-python and mixed exports (alone, then sharing one
server), its all-libtorch export as TorchScript and compiled ahead of time (each on a server with
the pytorch backend alone) and Merlin Systems 23.08, then the model's step compiled ahead of time
against its TorchScript in-process, and write benchmarks/results/latest.{json,md,png}
(``--quick``: a smoke run, written as quick.*; ``--only client``: what Client and AsyncClient cost
on the mixed and all-libtorch exports, written as client.*; ``--only compiled``: the model's step
compiled ahead of time against its TorchScript alone, written as compiled.*).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
# Run as a script, Python puts benchmarks/ itself on the path; `benchmarks` and `examples` live
# one level up.
if str(REPOSITORY_ROOT) not in sys.path:
    sys.path.insert(0, str(REPOSITORY_ROOT))

import warnings

# Merlin warns about TensorFlow's absence and Transformers4Rec about deprecated transformers APIs
# on import; neither says anything about this run. Set before the imports below trigger them.
for _category in (UserWarning, FutureWarning, DeprecationWarning):
    warnings.filterwarnings("ignore", category=_category)

import argparse
import contextlib
import signal
import tempfile
import time

from benchmarks.bench import Benchmark, Mode
from benchmarks.environment import BUSY_MACHINE_CORES
from benchmarks.results import SYSTEM_LABELS, Measurement
from benchmarks.systems import ASYNC_CONCURRENCIES, ASYNC_SESSIONS
from merlin_torch_serving.backends.pytorch_build import BUILD_COMMAND, built_for_running_torch

SESSION_COUNTS = (1, 32)
#: ``--only client``: what the clients cost is measured on one-session requests
CLIENT_SESSION_COUNTS = (1,)
CONCURRENCIES = (1, 8)
PROTOCOLS = ("grpc", "http")
RESULTS_DIR = REPOSITORY_ROOT / "benchmarks" / "results"
# Loading a model that imports torch and NVTabular in a stub takes tens of seconds on 2 cores.
SERVER_START_TIMEOUT_S = 300.0

# Full warm-up: one pass over a setting's 16 different requests (see workload.REQUESTS_PER_SETTING),
# enough for TorchScript to finish compiling for the shapes it will see.
FULL = Mode("full", warmup_requests=16, timed_requests=300, time_budget_s=5.0, part_repetitions=200)
QUICK = Mode("quick", warmup_requests=4, timed_requests=20, time_budget_s=1.0, part_repetitions=10)


class Progress:
    """One line per step and per measurement, with the time since the run began."""

    def __init__(self, total_measurements: int):
        self.began = time.perf_counter()
        self.total = total_measurements
        self.done = 0

    def step(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", flush=True)

    def measured(self, m: Measurement) -> None:
        self.done += 1
        rss = f"  RSS {m.server_rss_mb:5.0f} MB" if m.server_rss_mb is not None else ""
        busy = (
            f"  other CPU {m.other_cpu_cores:.2f}" if m.other_cpu_cores > BUSY_MACHINE_CORES else ""
        )
        self.step(
            f"{self.done:2d}/{self.total} {SYSTEM_LABELS[m.system]:<31} {m.protocol:<10}"
            f" {m.client:<32} {m.sessions:2d} sess x{m.concurrency}  p50 {m.p50_ms:8.2f} ms  p99"
            f" {m.p99_ms:8.2f} ms  {m.requests_per_s:7.1f} req/s  {m.sessions_per_s:7.0f} sess/s "
            f" n={m.requests}{rss}{busy}"
        )

    def elapsed(self) -> float:
        return time.perf_counter() - self.began


def main(argv: list[str] | None = None) -> int:
    arguments, rest = _parse_arguments(argv)
    if arguments.only == "catalog":
        from benchmarks import catalog

        return catalog.main(
            rest
            + (["--quick"] if arguments.quick else [])
            + ["--output-dir", str(arguments.output_dir)]
        )
    if arguments.only == "compiled":
        from benchmarks import compiled

        return compiled.main(rest + ["--output-dir", str(arguments.output_dir)])
    if arguments.only == "merging":
        from benchmarks import inprocess_merging

        return inprocess_merging.main(rest + ["--output-dir", str(arguments.output_dir)])
    if arguments.only == "multistage":
        from benchmarks import multistage

        return multistage.main(
            rest
            + (["--quick"] if arguments.quick else [])
            + ["--output-dir", str(arguments.output_dir)]
        )
    if arguments.only == "idle":
        from benchmarks import idle

        return idle.main(rest + ["--output-dir", str(arguments.output_dir)])
    if arguments.only == "log":
        from benchmarks import answer_log

        return answer_log.main(rest + ["--output-dir", str(arguments.output_dir)])
    if arguments.only == "routing":
        from benchmarks import routing

        return routing.main(rest + ["--output-dir", str(arguments.output_dir)])
    if arguments.only == "scoring":
        from benchmarks import scoring

        return scoring.main(rest + ["--output-dir", str(arguments.output_dir)])
    if arguments.only == "sessions":
        from benchmarks import sessions

        return sessions.main(rest + ["--output-dir", str(arguments.output_dir)])
    if rest:
        raise SystemExit(f"error: unrecognized arguments: {' '.join(rest)}")
    mode = QUICK if arguments.quick else FULL
    client_only = arguments.only == "client"
    if built_for_running_torch() is None:
        print(
            "error: the mixed export runs on Triton's pytorch backend, which is not built for this"
            f" torch; build it with `./run {BUILD_COMMAND} --sources PATH` (PATH: its release"
            " sources), or set MTS_PYTORCH_BACKEND_SOURCES=PATH and run ./run setup",
            file=sys.stderr,
        )
        return 1
    # SIGTERM unwinds like Ctrl-C, so every running tritonserver is stopped on the way out.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    progress = Progress(total_measurements=_measurement_count(client_only))
    with _work_directory(arguments.work_dir) as work_dir:
        benchmark = Benchmark(
            mode=mode,
            work_dir=work_dir,
            progress=progress,
            session_counts=CLIENT_SESSION_COUNTS if client_only else SESSION_COUNTS,
            concurrencies=CONCURRENCIES,
            protocols=PROTOCOLS,
            server_start_timeout_s=SERVER_START_TIMEOUT_S,
            repository_root=REPOSITORY_ROOT,
            client_only=client_only,
        )
        benchmark.run()
    stem = ("client" if client_only else "latest") if mode is FULL else "quick"
    written = benchmark.write(arguments.output_dir, stem)
    progress.step("targets:")
    for target in benchmark.targets:
        print("  " + target.line(), flush=True)
    progress.step("wrote " + ", ".join(str(path) for path in written))
    return 0


def _measurement_count(client_only: bool = False) -> int:
    # AsyncClient on the mixed and all-libtorch exports, per protocol and coroutine count, and
    # there the three client paths interleaved, per protocol
    awaited = 2 * len(PROTOCOLS) * (len(ASYNC_SESSIONS) * len(ASYNC_CONCURRENCIES) + 3)
    if client_only:  # those two exports through Client and prebuilt, and AsyncClient
        return 2 * len(PROTOCOLS) * 2 * len(CLIENT_SESSION_COUNTS) * len(CONCURRENCIES) + awaited
    # in-process once; floor, this project's four exports (Client and prebuilt each) and Merlin
    # per protocol; then two exports sharing a server, one client each, per request size
    per_setting = 1 + len(PROTOCOLS) * (1 + 2 + 2 + 2 + 2 + 1)
    return (
        len(SESSION_COUNTS) * len(CONCURRENCIES) * per_setting + 2 * len(SESSION_COUNTS) + awaited
    )


def _parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./run bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a minute or two; writes quick.*"
    )
    parser.add_argument(
        "--only",
        choices=["catalog", "client", "compiled", "idle", "log", "merging", "multistage", "routing"]
        + ["scoring", "sessions"],
        help=(
            "run only what Client and AsyncClient cost on the mixed and all-libtorch exports"
            " (the client rows of the full run; writes client.*), the catalog sweep"
            " (benchmarks/catalog.py; its own options follow, e.g."
            " --sizes, --index), the model's step compiled ahead of time against its TorchScript,"
            " in-process, and its compile times (benchmarks/compiled.py), the cost of a pause"
            " without requests (benchmarks/idle.py),"
            " what the answer log costs the requests it logs (benchmarks/answer_log.py),"
            " concurrent in-process calls, merged or not (benchmarks/inprocess_merging.py), the"
            " multi-stage pipeline against Merlin Systems' (benchmarks/multistage.py), what a"
            " route costs one session (benchmarks/routing.py), batch scoring on Dask against a"
            " loop and a served client (benchmarks/scoring.py) or live sessions against whole"
            " histories (benchmarks/sessions.py)"
        ),
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=RESULTS_DIR,
        help=f"where results go (default {RESULTS_DIR})",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help=(
            "keep the model repositories and server logs here (default: a temporary folder,"
            " removed)"
        ),
    )
    return parser.parse_known_args(argv)


@contextlib.contextmanager
def _work_directory(path: Path | None):
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-bench-") as scratch:
        yield Path(scratch)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
