"""What the python steps' own metrics cost a request: Transformers4Rec's getting-started example
exported twice into one repository, with ``ModelOptions(metrics=True)`` (the default) and
``metrics=False``, served by one tritonserver, one-session requests interleaved between the two.

    ./run python benchmarks/step_metrics.py [--rounds 400]

Prints, for each export, the client's p50 and p90 over gRPC and Triton's own mean time in the
fused python step (its statistics, differenced over the run: no transport noise), then the
differences (on - off: the median of paired requests, and of the p50s and step means) with their
ratios, and the CPU other processes took meanwhile. On a busy machine those differences drown in
noise, so the cost is also measured in its two parts: the step run in this process with and
without collecting (interleaved, medians of the thread's CPU time, which other processes do not
inflate), and one counter increment in a stub of the same server
(a probe model that increments 2,000 times), with the number of series one request touches.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:
    sys.path.insert(0, str(REPOSITORY_ROOT))

import argparse
import os
import tempfile
import textwrap
import time

import numpy as np
import psutil
import tritonclient.http as httpclient

from benchmarks import server_stats
from benchmarks.environment import OtherCpuLoad
from merlin_torch_serving import Client, ModelOptions, TritonServer
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.export.python_model import HostedStep
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.graph.threads import torch_threads
from tests.official import getting_started
from tests.official.example import one_session_requests, prepare

EXPORTS = {"metrics on": ModelOptions(), "metrics off": ModelOptions(metrics=False)}
PROBE_INCREMENTS = 2000
PROBE_CONFIG = """\
name: "increment_probe"
backend: "python"
max_batch_size: 0
input [{ name: "N", data_type: TYPE_INT64, dims: [1] }]
output [{ name: "US", data_type: TYPE_FP64, dims: [1] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
PROBE_MODEL = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # the family must outlive its metrics
        self.family = pb_utils.MetricFamily(
            name="probe_total", description="probe", kind=pb_utils.MetricFamily.COUNTER
        )
        self.counter = self.family.Metric(labels={"model": "increment_probe"})

    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            began = time.perf_counter()
            for _ in range(n):
                self.counter.increment(1.0)
            us = (time.perf_counter() - began) / n * 1e6
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("US", np.array([us]))]))
        return responses
"""


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
        _write_probe(Path(work) / "repository")
        sessions = one_session_requests(example)
        print(
            f"{psutil.cpu_count()} cores; {len(sessions)} one-session requests of "
            f"{min(map(len, sessions))} to {max(map(len, sessions))} clicks; steps: "
            + "; ".join(f"{label}: {', '.join(steps)}" for label, (_, steps) in names.items())
        )
        with TritonServer(Path(work) / "repository", start_timeout_s=300) as server:
            client = Client(server.grpc_url)
            for name, _ in names.values():
                for frame in sessions:
                    client.infer(name, frame)

            def own() -> list[int]:
                children = psutil.Process(server.pid).children(recursive=True)
                return [server.pid, *[p.pid for p in children]]

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
            increment_us = _increment_us(server.http_url)
        print(
            f"{arguments.rounds} requests per export, interleaved; other processes took"
            f" {load.other_cores:.2f} cores (steal {load.steal_cores:.2f}); load average"
            f" {', '.join(f'{x:.2f}' for x in psutil.getloadavg())}"
        )
        step_us = {}
        for label, (_, steps) in names.items():
            step_us[label] = sum(in_server[step]["request_ms"] for step in steps) * 1e3
            print(
                f"  {label:<12} client p50 {np.percentile(times[label], 50):8.0f} us   p90"
                f" {np.percentile(times[label], 90):8.0f} us   in the python step(s)"
                f" {step_us[label]:8.0f} us"
            )
        on, off = times["metrics on"], times["metrics off"]
        paired = np.asarray(on) - np.asarray(
            off
        )  # the same session, sent one right after the other
        print(
            f"  on - off: median of paired differences {np.median(paired):+.0f} us (interquartile"
            f" {np.percentile(paired, 25):+.0f} .. {np.percentile(paired, 75):+.0f} us)"
        )
        print(
            f"  on - off: client p50 {np.percentile(on, 50) - np.percentile(off, 50):+.0f} us "
            f"(ratio {np.percentile(on, 50) / np.percentile(off, 50):.3f}); in the step "
            f"{step_us['metrics on'] - step_us['metrics off']:+.0f} us "
            f"(ratio {step_us['metrics on'] / step_us['metrics off']:.3f})"
        )
        (step,) = names["metrics on"][1]
        in_process_us, increments = _in_process(
            Path(work) / "repository" / step / "1", ensemble, sessions
        )
        print(
            f"  in this process, the fused step: {in_process_us['off']:.0f} us without collecting,"
            f" {in_process_us['on']:.0f} us with ({in_process_us['on'] - in_process_us['off']:+.1f}"
            f" us; medians of the thread's CPU time over {IN_PROCESS_ROUNDS} interleaved runs)"
        )
        print(
            f"  one counter increment from a stub: {increment_us:.1f} us (median of 5 x"
            f" {PROBE_INCREMENTS}); a request touches {increments:.1f} series, published once a"
            " second by the step's thread, not per request (per request that would be"
            f" {increments * increment_us:.0f} us)"
        )
    return 0


IN_PROCESS_ROUNDS = 2000


def _write_probe(repository: Path) -> None:
    (repository / "increment_probe" / "1").mkdir(parents=True)
    (repository / "increment_probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (repository / "increment_probe" / "1" / "model.py").write_text(textwrap.dedent(PROBE_MODEL))


def _increment_us(http_url: str) -> float:
    client = httpclient.InferenceServerClient(http_url)
    try:
        samples = []
        for _ in range(5):
            count = httpclient.InferInput("N", [1], "INT64")
            count.set_data_from_numpy(np.array([PROBE_INCREMENTS], dtype=np.int64))
            samples.append(float(client.infer("increment_probe", [count]).as_numpy("US")[0]))
        return float(np.median(samples))
    finally:
        client.close()


def _in_process(version_dir: Path, ensemble, sessions) -> tuple[dict[str, float], float]:
    """Median microseconds of the exported step run here with and without collecting, and the mean
    number of increments one request publishes (its counters plus the request count)."""
    step = HostedStep.load(os.fspath(version_dir))
    requests = [
        wire.to_wire(frames.frame_to_table(frame, ensemble.input_schema)) for frame in sessions
    ]
    times = {"on": [], "off": []}
    increments = []
    with torch_threads(1):
        for round_ in range(IN_PROCESS_ROUNDS):
            arrays = requests[round_ % len(requests)]
            for label in ("off", "on") if round_ % 2 else ("on", "off"):
                # this thread's CPU time: what other processes take of the machine does not count
                began = time.thread_time()
                if label == "on":
                    with metrics.collecting() as collected:
                        step.run(arrays)
                else:
                    step.run(arrays)
                times[label].append((time.thread_time() - began) * 1e6)
            increments.append(1 + sum(1 for value in collected.totals.values() if value))
    return {label: float(np.median(values)) for label, values in times.items()}, float(
        np.mean(increments)
    )


if __name__ == "__main__":
    sys.exit(main())
