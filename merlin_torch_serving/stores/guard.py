"""A store as serving sees it: calls that never raise, skip the store for a while after it
failed, and remember its state for health reports (``GuardedStore``); and what operators read from
a store while they serve, read again at most every so often (``Refreshed``).

A call that fails (refused, timed out, an error) returns the caller's fallback, is counted
(``mts_store_errors_total{store}``), and makes the calls of the next ``retry_after_s`` return
their fallback at once, so a store that hangs costs one timeout, not one per request. That state
and window are ``Outages``', which the feature server's client (``multistage.feature_server``)
keeps for its server too.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from merlin_torch_serving.graph import metrics
from merlin_torch_serving.graph.rehearsal import is_rehearsal
from merlin_torch_serving.stores.base import Store
from merlin_torch_serving.stores.opening import shared_store
from merlin_torch_serving.stores.settings import StoreSettings

logger = logging.getLogger("merlin_torch_serving")

T = TypeVar("T")


@dataclass(frozen=True)
class ServiceState:
    """What the last calls to an outside service (a store, a feature server) showed."""

    #: the service, as messages and health reports name it
    where: str
    #: whether the last call was answered
    reachable: bool
    #: why the last failing call failed ("" while it answers)
    last_error: str
    #: when the state last changed (``time.time()``)
    since: float


class Outages:
    """An outside service's state as calls to it find it, and the ``retry_after_s`` after a
    failure during which calls skip it; thread-safe. ``what`` names the service in the log ("the
    store"), ``meanwhile`` says what requests get while it does not answer."""

    def __init__(self, where: str, *, retry_after_s: float, what: str, meanwhile: str):
        self.retry_after_s = float(retry_after_s)
        self._what, self._meanwhile = what, meanwhile
        self._lock = threading.Lock()
        self._state = ServiceState(where, True, "", time.time())
        self._skip_until = 0.0

    @property
    def state(self) -> ServiceState:
        return self._state

    def skipping(self) -> bool:
        """Whether calls skip the service now (it failed less than ``retry_after_s`` ago)."""
        return time.monotonic() < self._skip_until

    def failed(self, reason: str, *, skip: bool = True) -> None:
        """A call failed for ``reason``; with ``skip``, the next ``retry_after_s`` skip it."""
        with self._lock:
            if skip:
                self._skip_until = time.monotonic() + self.retry_after_s
            where = self._state.where
            if self._state.reachable:
                logger.warning(
                    "%s at %s does not answer (%s); %s until it does",
                    self._what,
                    where,
                    reason,
                    self._meanwhile,
                )
                self._state = ServiceState(where, False, reason, time.time())
            elif reason != self._state.last_error:
                self._state = ServiceState(where, False, reason, self._state.since)

    def answered(self) -> None:
        """A call was answered."""
        if self._state.reachable:
            return
        with self._lock:
            if not self._state.reachable:
                logger.warning("%s at %s answers again", self._what, self._state.where)
                self._state = ServiceState(self._state.where, True, "", time.time())


class GuardedStore:
    """Calls to the store of ``settings`` that answer a fallback instead of raising (see the
    module's docstring); thread-safe. The store is opened on the first call and shared by every
    caller of this process (``opening.shared_store``; a forked child opens its own). ``label``
    names the store in the counters."""

    def __init__(
        self, settings: StoreSettings, *, retry_after_s: float = 1.0, label: str = "store"
    ):
        self.settings = settings
        self.label = label
        self.outages = Outages(
            settings.describe(),
            retry_after_s=retry_after_s,
            what="the store",
            meanwhile="requests are answered without it",
        )
        self._store: Store | None = None
        self._pid = 0

    @property
    def state(self) -> ServiceState:
        return self.outages.state

    @property
    def store(self) -> Store:
        if self._store is None or self._pid != os.getpid():
            self._store, self._pid = shared_store(self.settings), os.getpid()
        return self._store

    def call(self, work: Callable[[Store], T], fallback: T) -> T:
        """``work(store)``, or ``fallback`` when the store fails or is being skipped."""
        if self.outages.skipping():
            metrics.count(metrics.STORE_ERRORS, 1, store=self.label)
            return fallback
        try:
            answer = work(self.store)
        except Exception as error:  # any failure is answered with the fallback, never raised
            metrics.count(metrics.STORE_ERRORS, 1, store=self.label)
            self.outages.failed(f"{type(error).__name__}: {error}")
            return fallback
        self.outages.answered()
        return answer


class Refreshed(Generic[T]):
    """What an operator reads from its store while it serves (a block list, a trending ranking):
    ``read`` through ``guard`` and made into the value by ``convert``, again once the last read is
    ``refresh_s`` old, by one caller while the others keep the value they have. A read that fails
    leaves the last value in force (``initial`` before the first), and a rehearsal reads nothing
    (the export's machine may not reach the serving store)."""

    def __init__(
        self,
        guard: GuardedStore,
        read: Callable[[Store], Any],
        convert: Callable[[Any], T],
        initial: T,
        refresh_s: float,
    ):
        self.guard = guard
        self.refresh_s = float(refresh_s)
        self._read, self._convert = read, convert
        self._value = initial
        self._read_at = -float("inf")
        self._lock = threading.Lock()

    def value(self) -> T:
        if is_rehearsal():
            return self._value
        if time.monotonic() - self._read_at >= self.refresh_s and self._lock.acquire(False):
            try:
                read = self.guard.call(self._read, None)
                self._read_at = time.monotonic()
                if read is not None:
                    self._value = self._convert(read)
            finally:
                self._lock.release()
        return self._value
