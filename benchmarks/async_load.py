"""Closed-loop load from one event loop: ``coroutines`` coroutines share one asyncio client (one
connection pool, as a web service's worker holds it) and send requests back to back in the
calling thread; a fixed warm-up, then timed requests until a count or a time budget is reached
(the same ``LoadSettings`` and ``LoadResult`` as ``load.run_load``'s threads).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

import numpy as np

from benchmarks.load import LoadError, LoadResult, LoadSettings

#: ``send(i)`` sends request ``i`` and waits for the whole answer
AsyncSend = Callable[[int], Awaitable[None]]
#: connects (one metadata call) and returns ``send`` and the client's ``close``
AsyncSenderFactory = Callable[[], Awaitable[tuple[AsyncSend, Callable[[], Awaitable[None]]]]]
# Bounds the wait for the last answers after the time budget, so a hung server fails the run.
_WAIT_TIMEOUT_S = 120.0


def run_async_load(
    make_sender: AsyncSenderFactory,
    coroutines: int,
    settings: LoadSettings,
    on_timing_start: Callable[[], None] | None = None,
) -> LoadResult:
    """Measure ``coroutines`` closed-loop coroutines of one event loop sharing one sender."""
    return asyncio.run(_load(make_sender, coroutines, settings, on_timing_start))


async def _load(make_sender, coroutines, settings, on_timing_start) -> LoadResult:
    send, close = await make_sender()
    try:
        warmup_each = max(1, math.ceil(settings.warmup_requests / coroutines))
        await asyncio.gather(
            *(
                send(slot * warmup_each + index)
                for slot in range(coroutines)
                for index in range(warmup_each)
            )
        )
        if on_timing_start is not None:
            on_timing_start()
        started = time.perf_counter()
        deadline = started + settings.time_budget_s
        issued = 0
        latencies: list[float] = []
        last_answer = started

        async def client() -> None:
            nonlocal issued, last_answer
            while issued < settings.timed_requests and time.perf_counter() < deadline:
                issued += 1
                began = time.perf_counter()
                await send(issued)
                last_answer = time.perf_counter()
                latencies.append((last_answer - began) * 1000.0)

        try:
            await asyncio.wait_for(
                asyncio.gather(*(client() for _ in range(coroutines))),
                settings.time_budget_s + _WAIT_TIMEOUT_S,
            )
        except TimeoutError as error:
            raise LoadError(
                f"a request was still unanswered {_WAIT_TIMEOUT_S:g} s after the time budget"
            ) from error
    finally:
        await close()
    if not latencies:
        raise LoadError("no request completed in the time budget")
    return LoadResult(latencies_ms=np.array(latencies), wall_s=last_answer - started)
