"""Per-request time of the compiled session workflow against NVTabular's own transform (printed
only).

Run from the checkout: ``.venv/bin/python -m tests.fastpath.bench_session_workflow``.
"""

from __future__ import annotations

import functools
import tempfile
import time
import warnings

import numpy as np
import pandas as pd

from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath.helpers import (
    assert_wire_equal,
    interactions,
    known_ids,
    oracle,
    session_workflow,
)


def request(
    sessions: int, rows_per_session: int, known_items: list, seed: int = 0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = sessions * rows_per_session
    order = rng.permutation(rows)
    return {
        "session_id": np.repeat(rng.choice(10**6, sessions, replace=False), rows_per_session)[
            order
        ],
        "timestamp": rng.integers(0, 10**6, rows),
        "item_id": rng.choice(np.array(known_items + [10**9]), rows),
        "category": rng.integers(0, 17, rows),
    }


def per_call_ms(function, runs: int) -> tuple[float, float]:
    """Median and 90th percentile of one call, in milliseconds, after a short warm-up."""
    for _ in range(min(20, runs)):
        function()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3), float(np.percentile(times, 90) * 1e3)


def main() -> None:
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as categories:
        workflow = session_workflow(
            interactions(seed=7, rows=20_000, sessions=2_000, items=1_000), categories
        )
        start = time.perf_counter()
        compiled = compile_workflow(workflow)
        print(
            f"compile_workflow: {(time.perf_counter() - start) * 1e3:.1f} ms, fallbacks:"
            f" {compiled.fallbacks}"
        )
        items = known_ids(workflow, "item_id")
        for sessions in (1, 32):
            columns = request(sessions, 10, items)
            assert_wire_equal(compiled.transform(columns), oracle(workflow, columns))
            frame = pd.DataFrame(columns)
            nvt_p50, nvt_p90 = per_call_ms(functools.partial(workflow.transform, frame), runs=200)
            fast_p50, fast_p90 = per_call_ms(
                functools.partial(compiled.transform, columns), runs=500
            )
            print(
                f"{sessions:>2} session(s) x 10 rows: workflow.transform p50 {nvt_p50:7.2f} ms (p90"
                f" {nvt_p90:7.2f}), compiled p50 {fast_p50:6.3f} ms (p90 {fast_p90:6.3f}),"
                f" {nvt_p50 / fast_p50:5.0f}x"
            )


if __name__ == "__main__":
    main()
