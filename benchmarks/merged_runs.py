"""What a merged run saves inside a batched step, without a server or clients: the step of an
export made with ``ModelOptions(batching=True)``, loaded in this process, answers N one-session
requests in one merged run and one by one, interleaved, one torch thread, as the server would.

    ./run python benchmarks/merged_runs.py PATH/TO/<ensemble>-0-<step>   [--counts 1 8 32]
    ./run python benchmarks/merged_runs.py PATH/TO/<ensemble>-1-<libtorch step> \
        --feeder PATH/TO/<ensemble>-0-<python step>

A python step runs through ``HostedStep.run_batch`` and ``HostedStep.run``; its requests are its
warm-up sample under distinct session ids. A libtorch step (its ``model.pt``) runs on what Triton's
pytorch backend would hand it (``libtorch_batching.flat_batch``) for the answers of the python step
that feeds it to those requests. Served throughput adds Triton's and the clients' own cost per
request, which a merged run does not remove.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:
    sys.path.insert(0, str(REPOSITORY_ROOT))

from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.libtorch_batching import flat_batch
from merlin_torch_serving.export.python_model import HostedStep, renamed_copy
from merlin_torch_serving.export.warmup_files import WARMUP_DIR, read_warmup_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", type=Path, help="the folder of a batched step model")
    parser.add_argument(
        "--feeder", type=Path, help="for a libtorch step: the folder of the python step feeding it"
    )
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=15)
    arguments = parser.parse_args(argv)
    config = configs.from_pbtxt((arguments.step / "config.pbtxt").read_text())
    if config.backend == "pytorch" and arguments.feeder is None:
        parser.error(
            f"{arguments.step.name} is a libtorch step: name the step feeding it, --feeder"
        )
    torch.set_num_threads(1)
    if config.backend == "pytorch":
        runs = _libtorch_runs(arguments.step, config, arguments.feeder)
    else:
        runs = _python_runs(arguments.step, config)
    for count in arguments.counts:
        merged_run, alone_run = runs(count)
        for _ in range(3):
            merged_run()
            alone_run()
        merged, alone = [], []
        for _ in range(arguments.repeats):
            began = time.perf_counter()
            merged_run()
            merged.append(time.perf_counter() - began)
            began = time.perf_counter()
            alone_run()
            alone.append(time.perf_counter() - began)
        merged_ms, alone_ms = np.median(merged) * 1000, np.median(alone) * 1000
        print(
            f"{count} one-session requests: merged run {merged_ms:.2f} ms "
            f"({merged_ms / count:.3f} ms a request), one by one {alone_ms:.2f} ms, "
            f"x{alone_ms / merged_ms:.2f}"
        )
    return 0


def _python_runs(folder: Path, config):
    """count -> (merged, one by one) runs of a batched python step on ``count`` requests."""
    step, requests = _step_and_requests(folder, config)

    def runs(count: int):
        chosen = requests(count)

        def alone() -> None:
            for request in chosen:
                step.run(request)

        return lambda: step.run_batch(chosen), alone

    return runs


def _libtorch_runs(folder: Path, config, feeder_folder: Path):
    """count -> (merged, one by one) runs of a batched libtorch step on what its feeder answers
    to ``count`` requests, with the backend's settings: inference mode, no optimized execution."""
    feeder_config = configs.from_pbtxt((feeder_folder / "config.pbtxt").read_text())
    feeder, requests = _step_and_requests(feeder_folder, feeder_config)
    names = [spec.name for spec in config.input if spec.name != configs.ROWS_TENSOR]
    module = torch.jit.load(str(folder / str(_version(folder)) / configs.LIBTORCH_MODEL_FILE))

    def run(batch: list[dict[str, np.ndarray]]) -> None:
        tensors = {name: torch.from_numpy(a) for name, a in flat_batch(batch).items()}
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            module(tensors)

    def runs(count: int):
        fed = [
            {name: answer[name] for name in names} for answer in map(feeder.run, requests(count))
        ]

        def alone() -> None:
            for one in fed:
                run([one])

        return lambda: run(fed), alone

    return runs


def _step_and_requests(folder: Path, config):
    """A batched python step, and count -> that many copies of its warm-up sample as distinct
    sessions."""
    warmup = json.loads(config.parameters[configs.WARMUP_PARAMETER].string_value)
    sample = read_warmup_files(str(folder / WARMUP_DIR), warmup["inputs"])
    step = HostedStep.load(str(folder / str(_version(folder))), step=config.name)
    return step, lambda count: [renamed_copy(sample, step.merge_keys, i) for i in range(count)]


def _version(folder: Path) -> int:
    return max(int(p.name) for p in folder.iterdir() if p.name.isdigit())


if __name__ == "__main__":
    sys.exit(main())
