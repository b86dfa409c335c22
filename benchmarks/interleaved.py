"""One-session requests through several client paths taking turns, request by request, from one
event loop: the paths differ by tenths of a millisecond on a request of about two, less than the
machine's drift between two measurements made one after the other, so what a client costs on top
of another is read from requests sent side by side. The order rotates each round; a blocking path
is called straight from the loop (nothing else runs on it meanwhile), an asyncio one awaited.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pandas as pd

from benchmarks.load import LoadResult, LoadSettings
from benchmarks.systems import ClientPath
from benchmarks.targets import INTERLEAVED

#: how an interleaved measurement's client path is named in the records
SUFFIX = INTERLEAVED


def interleaved(
    clients: tuple[ClientPath, ...],
    url: str,
    protocol: str,
    requests: list[pd.DataFrame],
    settings: LoadSettings,
) -> dict[str, LoadResult]:
    """Each path's latencies over the same rounds: warm-up rounds, then up to
    ``settings.timed_requests`` rounds or ``settings.time_budget_s`` per path."""
    return asyncio.run(_rounds(clients, url, protocol, requests, settings))


async def _rounds(clients, url, protocol, requests, settings) -> dict[str, LoadResult]:
    senders, closers = {}, []
    try:
        for client in clients:
            if client.asynchronous:
                send, close = await client.make_sender(url, protocol, requests)
                senders[client.name] = (send, True)
                closers.append(close)
            else:
                senders[client.name] = (client.make_sender(url, protocol, requests), False)
        names = list(senders)
        for index in range(settings.warmup_requests):
            for name in names:
                await _send(*senders[name], index)
        latencies: dict[str, list[float]] = {name: [] for name in names}
        deadline = time.perf_counter() + settings.time_budget_s * len(names)
        for index in range(settings.timed_requests):
            if time.perf_counter() >= deadline:
                break
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                began = time.perf_counter()
                await _send(*senders[name], index)
                latencies[name].append((time.perf_counter() - began) * 1000.0)
    finally:
        for close in closers:
            await close()
    return {
        name: LoadResult(latencies_ms=np.array(values), wall_s=sum(values) / 1000.0)
        for name, values in latencies.items()
    }


async def _send(send, asynchronous: bool, index: int) -> None:
    if asynchronous:
        await send(index)
    else:
        send(index)
