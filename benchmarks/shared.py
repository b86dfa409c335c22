"""Both exports in one tritonserver, each under its own closed-loop client at the same time: the
all-python export's stub and the mixed export's libtorch model then compete for the cores with
their torch thread pools, as in a server that hosts both. Each is compared with itself served alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from benchmarks.load import LoadResult, LoadSettings, run_load
from benchmarks.systems import Sender

# Bounds the wait for the other export's clients to finish their warm-up.
_START_TIMEOUT_S = 120.0


def run_side_by_side(
    make_senders: dict[str, Callable[[], Sender]], settings: LoadSettings
) -> dict[str, LoadResult]:
    """One client per entry, all at once; their timing starts together and every one of them runs
    for the whole time budget, so each timed request overlaps the others' load."""
    start_together = threading.Barrier(len(make_senders))
    # no request count: a client that stopped early would leave the other ones a quieter server
    window = LoadSettings(
        settings.warmup_requests, timed_requests=2**31, time_budget_s=settings.time_budget_s
    )
    results: dict[str, LoadResult] = {}
    failures: list[BaseException] = []

    def measure(key: str) -> None:
        try:
            results[key] = run_load(
                make_senders[key],
                1,
                window,
                on_timing_start=lambda: start_together.wait(_START_TIMEOUT_S),
            )
        except BaseException as error:  # re-raised in the calling thread
            failures.append(error)
            start_together.abort()

    first, *others = make_senders
    threads = [threading.Thread(target=measure, args=(key,), daemon=True) for key in others]
    for thread in threads:
        thread.start()
    measure(first)
    for thread in threads:
        thread.join(timeout=settings.time_budget_s + 2 * _START_TIMEOUT_S)
    if failures:
        raise failures[0]
    return results
