"""Closed-loop load: ``concurrency`` clients, each with its own sender in its own thread, send
requests back to back; a fixed warm-up, then timed requests until a count or a time budget is
reached.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.systems import Sender

# Bounds every wait on another client, so a hung server fails the run instead of stalling it.
_WAIT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LoadSettings:
    """How long each measurement runs."""

    #: requests sent before timing, shared across the clients (at least one each)
    warmup_requests: int
    #: timed requests across all clients; timing stops earlier when the budget runs out
    timed_requests: int
    time_budget_s: float


@dataclass(frozen=True)
class LoadResult:
    latencies_ms: np.ndarray
    wall_s: float

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s


class LoadError(RuntimeError):
    """A request failed or a client hung; the first failure is the cause."""


def run_load(
    make_sender: Callable[[], Sender],
    concurrency: int,
    settings: LoadSettings,
    on_timing_start: Callable[[], None] | None = None,
) -> LoadResult:
    """Measure ``concurrency`` closed-loop clients, each calling ``make_sender`` in its own thread.

    The calling thread is the first client, so one client runs exactly as a caller's own code
    would: torch, for one, runs its intra-op threads several times slower when called from a
    thread other than the main one. ``on_timing_start`` runs once, after every client has warmed
    up and before any timed request (e.g. to snapshot the server's statistics).
    """
    warmup_per_client = max(1, math.ceil(settings.warmup_requests / concurrency))
    clock = {"started": math.inf, "deadline": math.inf}
    stop = threading.Event()
    lock = threading.Lock()
    issued = 0
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    last_answer = [0.0] * concurrency
    failures: list[BaseException] = []

    def start_clock() -> None:  # run by the barrier once every client has warmed up
        if on_timing_start is not None:
            try:
                on_timing_start()
            except BaseException as error:  # reported like a failed request
                failures.append(error)
                stop.set()
        clock["started"] = time.perf_counter()
        clock["deadline"] = clock["started"] + settings.time_budget_s

    ready = threading.Barrier(concurrency, action=start_clock)

    def next_ticket() -> int | None:
        nonlocal issued
        with lock:
            if (
                stop.is_set()
                or issued >= settings.timed_requests
                or time.perf_counter() >= clock["deadline"]
            ):
                return None
            issued += 1
            return issued

    def client(slot: int) -> None:
        send = None
        try:
            send = make_sender()
            for index in range(warmup_per_client):
                send(slot * warmup_per_client + index)
        except Exception as error:  # reported once every client has stopped
            failures.append(error)
            stop.set()
        try:
            ready.wait(timeout=_WAIT_TIMEOUT_S)
        except threading.BrokenBarrierError:
            failures.append(LoadError(f"the warm-up did not finish within {_WAIT_TIMEOUT_S:g} s"))
            return
        try:
            while send is not None and (ticket := next_ticket()) is not None:
                began = time.perf_counter()
                send(ticket)
                last_answer[slot] = time.perf_counter()
                latencies[slot].append((last_answer[slot] - began) * 1000.0)
        except Exception as error:
            failures.append(error)
            stop.set()

    others = [
        threading.Thread(target=client, args=(slot,), daemon=True) for slot in range(1, concurrency)
    ]
    for thread in others:
        thread.start()
    try:
        client(0)
        give_up = (
            min(clock["started"], time.perf_counter()) + settings.time_budget_s + _WAIT_TIMEOUT_S
        )
        for thread in others:
            thread.join(timeout=max(0.0, give_up - time.perf_counter()))
    finally:
        stop.set()
        ready.abort()  # frees clients still waiting if this thread stopped early (Ctrl-C)
    if failures:
        raise LoadError(f"a request failed: {failures[0]!r}") from failures[0]
    if any(thread.is_alive() for thread in others):
        raise LoadError(
            f"a request was still unanswered {_WAIT_TIMEOUT_S:g} s after the time budget"
        )
    merged = np.array([ms for per_client in latencies for ms in per_client])
    if len(merged) == 0:
        raise LoadError("no request completed in the time budget")
    return LoadResult(latencies_ms=merged, wall_s=max(last_answer) - clock["started"])
