"""A store as serving sees it: calls that never raise, skip the store for a while after it
failed, and remember its state for health reports, as ``multistage.feature_server`` does for a
feature server.

A call that fails (refused, timed out, an error) returns the caller's fallback, is counted
(``mts_store_errors_total{store}``), and makes the calls of the next ``retry_after_s`` return
their fallback at once, so a store that hangs costs one timeout, not one per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from merlin_torch_serving.graph import metrics
from merlin_torch_serving.stores.base import Store

logger = logging.getLogger("merlin_torch_serving")

T = TypeVar("T")


@dataclass(frozen=True)
class StoreState:
    """What the last calls to a store showed."""

    where: str
    #: whether the last call was answered
    reachable: bool
    #: why the last failing call failed ("" while it answers)
    last_error: str
    #: when the state last changed (``time.time()``)
    since: float


class GuardedStore:
    """Calls to ``store`` that answer a fallback instead of raising (see the module's docstring);
    thread-safe. ``label`` names the store in the counters."""

    def __init__(self, store: Store, *, retry_after_s: float = 1.0, label: str = "store"):
        self.store = store
        self.retry_after_s = float(retry_after_s)
        self.label = label
        self._lock = threading.Lock()
        self._state = StoreState(store.describe(), True, "", time.time())
        self._skip_until = 0.0

    @property
    def state(self) -> StoreState:
        return self._state

    def call(self, work: Callable[[Store], T], fallback: T) -> T:
        """``work(store)``, or ``fallback`` when the store fails or is being skipped."""
        if time.monotonic() < self._skip_until:
            metrics.count(metrics.STORE_ERRORS, 1, store=self.label)
            return fallback
        try:
            answer = work(self.store)
        except Exception as error:  # any failure is answered with the fallback, never raised
            metrics.count(metrics.STORE_ERRORS, 1, store=self.label)
            self._failed(f"{type(error).__name__}: {error}")
            return fallback
        self._answered()
        return answer

    def _failed(self, reason: str) -> None:
        with self._lock:
            self._skip_until = time.monotonic() + self.retry_after_s
            if self._state.reachable:
                logger.warning(
                    "the store at %s does not answer (%s); requests are answered without it"
                    " until it does",
                    self._state.where,
                    reason,
                )
                self._state = StoreState(self._state.where, False, reason, time.time())
            elif reason != self._state.last_error:
                self._state = StoreState(self._state.where, False, reason, self._state.since)

    def _answered(self) -> None:
        if self._state.reachable:
            return
        with self._lock:
            if not self._state.reachable:
                logger.warning("the store at %s answers again", self._state.where)
                self._state = StoreState(self._state.where, True, "", time.time())
