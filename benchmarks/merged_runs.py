"""What a merged run saves inside a batched python step, without a server or clients: the step of
an export made with ``ModelOptions(batching=True)``, loaded in this process, answers N one-session
requests in one merged run (``HostedStep.run_batch``) and one by one (``HostedStep.run``),
interleaved, one torch thread, as its stub would.

    ./run python benchmarks/merged_runs.py PATH/TO/<ensemble>-0-<step>   [--counts 1 8 32]

The requests are the step's warm-up sample under distinct session ids. Served throughput adds
Triton's and the clients' own cost per request, which a merged run does not remove.
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
from merlin_torch_serving.export.python_model import HostedStep, renamed_copy
from merlin_torch_serving.export.warmup_files import WARMUP_DIR, read_warmup_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", type=Path, help="the folder of a batched python step model")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=15)
    arguments = parser.parse_args(argv)
    config = configs.from_pbtxt((arguments.step / "config.pbtxt").read_text())
    warmup = json.loads(config.parameters[configs.WARMUP_PARAMETER].string_value)
    sample = read_warmup_files(str(arguments.step / WARMUP_DIR), warmup["inputs"])
    version = max(int(p.name) for p in arguments.step.iterdir() if p.name.isdigit())
    step = HostedStep.load(str(arguments.step / str(version)), step=config.name)
    torch.set_num_threads(1)
    for count in arguments.counts:
        requests = [renamed_copy(sample, step.merge_keys, i) for i in range(count)]
        for _ in range(3):
            step.run_batch(requests)
            for request in requests:
                step.run(request)
        merged, alone = [], []
        for _ in range(arguments.repeats):
            began = time.perf_counter()
            step.run_batch(requests)
            merged.append(time.perf_counter() - began)
            began = time.perf_counter()
            for request in requests:
                step.run(request)
            alone.append(time.perf_counter() - began)
        merged_ms, alone_ms = np.median(merged) * 1000, np.median(alone) * 1000
        print(
            f"{count} one-session requests: merged run {merged_ms:.2f} ms, one by one "
            f"{alone_ms:.2f} ms, x{alone_ms / merged_ms:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
