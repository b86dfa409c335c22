"""What the python steps' own metrics cost a request: Transformers4Rec's getting-started example
exported twice into one repository, with ``ModelOptions(metrics=True)`` (the default) and
``metrics=False``, served by one tritonserver, one-session requests interleaved between the two.

    ./run python benchmarks/step_metrics.py [--rounds 400]

Prints, for each export, the client's p50 and p90 over gRPC and Triton's own mean time in the
fused python step (its statistics, differenced over the run: no transport noise), then the
differences (on - off: the median of paired requests, and of the p50s and step means) with their
ratios, and the CPU other processes took meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:
    sys.path.insert(0, str(REPOSITORY_ROOT))

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from benchmarks import server_stats  # noqa: E402
from benchmarks.environment import OtherCpuLoad  # noqa: E402
from merlin_torch_serving import Client, ModelOptions, TritonServer  # noqa: E402
from tests.official import getting_started  # noqa: E402
from tests.official.example import prepare  # noqa: E402

EXPORTS = {"metrics on": ModelOptions(), "metrics off": ModelOptions(metrics=False)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400, help="timed requests per export")
    arguments = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as work:
        example = prepare(getting_started, str(Path(work) / "categories"))
        ensemble = example.ensemble()
        names = {}
        for label, options in EXPORTS.items():
            name = "getting_started_" + label.replace(" ", "_")
            result = ensemble.export(Path(work) / "repository", name, options=options)
            names[label] = (name, [model for model in result.models if model != name])
        held_out = example.held_out
        lengths = held_out.groupby("session_id").size()
        sessions = [held_out[held_out["session_id"] == s] for s in lengths[lengths.between(3, 12)].index[:32]]
        print(f"{psutil.cpu_count()} cores; {len(sessions)} one-session requests of "
              f"{min(map(len, sessions))} to {max(map(len, sessions))} clicks; steps: "
              + "; ".join(f"{label}: {', '.join(steps)}" for label, (_, steps) in names.items()))
        with TritonServer(Path(work) / "repository", start_timeout_s=300) as server:
            client = Client(server.grpc_url)
            for name, _ in names.values():
                for frame in sessions:
                    client.infer(name, frame)
            own = lambda: [server.pid, *[p.pid for p in psutil.Process(server.pid).children(recursive=True)]]
            times = {label: [] for label in names}
            before = server_stats.snapshot(server.http_url)
            with OtherCpuLoad(own) as load:
                for round_ in range(arguments.rounds):
                    frame = sessions[round_ % len(sessions)]
                    order = list(names.items()) if round_ % 2 else list(reversed(names.items()))
                    for label, (name, _) in order:
                        began = time.perf_counter()
                        client.infer(name, frame)
                        times[label].append((time.perf_counter() - began) * 1e6)
            in_server = server_stats.per_request_ms(before, server_stats.snapshot(server.http_url))
            client.close()
        print(f"{arguments.rounds} requests per export, interleaved; other processes took {load.other_cores:.2f} "
              f"cores (steal {load.steal_cores:.2f}); load average {', '.join(f'{x:.2f}' for x in psutil.getloadavg())}")
        step_us = {}
        for label, (_, steps) in names.items():
            step_us[label] = sum(in_server[step]["request_ms"] for step in steps) * 1e3
            print(f"  {label:<12} client p50 {np.percentile(times[label], 50):8.0f} us   "
                  f"p90 {np.percentile(times[label], 90):8.0f} us   in the python step(s) {step_us[label]:8.0f} us")
        on, off = times["metrics on"], times["metrics off"]
        paired = np.asarray(on) - np.asarray(off)  # the same session, sent one right after the other
        print(f"  on - off: median of paired differences {np.median(paired):+.0f} us "
              f"(interquartile {np.percentile(paired, 25):+.0f} .. {np.percentile(paired, 75):+.0f} us)")
        print(f"  on - off: client p50 {np.percentile(on, 50) - np.percentile(off, 50):+.0f} us "
              f"(ratio {np.percentile(on, 50) / np.percentile(off, 50):.3f}); in the step "
              f"{step_us['metrics on'] - step_us['metrics off']:+.0f} us "
              f"(ratio {step_us['metrics on'] / step_us['metrics off']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
