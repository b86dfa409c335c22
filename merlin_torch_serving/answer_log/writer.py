"""The answer log's writer: answers queue in memory and a thread of their own writes them out every
flush interval, so a request never waits for a disk or for Redis.

The queue holds at most ``max_pending`` records. A flush that fails (a full disk, Redis down) keeps
its records queued for the next flush; while the queue is full, new answers are dropped and
counted, never waited for. ``close`` writes what is queued before it returns (a graceful stop loses
nothing); a killed process loses what came after its last flush, at most one flush interval.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from merlin_torch_serving.answer_log import records
from merlin_torch_serving.answer_log.destinations import Destination, ParquetFolder

logger = logging.getLogger(__name__)

#: the default flush interval, and how long ``close`` may take writing what is left
FLUSH_INTERVAL_S = 1.0
CLOSE_TIMEOUT_S = 30.0


class Sink(Protocol):
    """What writes a destination from one process (``parquet_sink``, ``redis_sink``)."""

    def write(self, table: pa.Table, number: int) -> None:
        """Write ``table``'s records durably, or raise; ``number`` counts this process's flushes
        (a flush that failed comes again with the same number and records: written once)."""

    def tick(self) -> None:
        """Called every flush: publish what is due."""

    def close(self) -> None:
        """Publish what is open."""


@dataclass(frozen=True)
class _Flush:
    """One flush: the ``batches`` first queued answers as ``table``."""

    number: int
    batches: int
    table: pa.Table


@dataclass(frozen=True)
class WriterCounts:
    """Records the log wrote and dropped, and its flushes that failed, since the last ``take``."""

    written: int = 0
    dropped: int = 0
    failed_flushes: int = 0


@dataclass(frozen=True)
class WriterStatus:
    """How the log fares: ``failing`` while its last flush failed (``error`` says why)."""

    destination: str
    pending: int
    written: int
    dropped: int
    failed_flushes: int
    failing: bool
    error: str = ""


class AnswerWriter:
    """Writes ``Answers`` to ``destination`` from a thread, every ``flush_interval_s``."""

    def __init__(
        self,
        destination: Destination,
        *,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        max_pending: int = 100_000,
        session_id_key: str | None = None,
    ):
        self.destination = destination
        self.flush_interval_s = float(flush_interval_s)
        self.max_pending = int(max_pending)
        self.session_id_key = session_id_key
        self._pending: collections.deque[records.Answers] = collections.deque()
        self._pending_rows = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closed = False
        self._sink: Sink | None = None
        self._flushes = 0
        self._inflight: _Flush | None = None
        self._totals = {"written": 0, "dropped": 0, "failed_flushes": 0}
        self._taken = dict(self._totals)
        self._error = ""
        self._thread = threading.Thread(target=self._run, name="mts-answer-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def submit(self, answers: records.Answers) -> bool:
        """Queue ``answers``; False (they are dropped and counted) when the queue is full."""
        with self._lock:
            if self._closed or self._pending_rows + answers.rows > self.max_pending:
                self._totals["dropped"] += answers.rows
                return False
            self._pending.append(answers)
            self._pending_rows += answers.rows
            return True

    def take_counts(self) -> WriterCounts:
        """What was written, dropped and failed since the last call."""
        with self._lock:
            taken = {key: value - self._taken[key] for key, value in self._totals.items()}
            self._taken = dict(self._totals)
        return WriterCounts(**taken)

    def status(self) -> WriterStatus:
        with self._lock:
            return WriterStatus(
                self.destination.describe(),
                self._pending_rows,
                self._totals["written"],
                self._totals["dropped"],
                self._totals["failed_flushes"],
                bool(self._error),
                self._error,
            )

    def flush(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until everything queued now is written; False when it was not within
        ``timeout_s`` (the destination fails)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            target = self._totals["written"] + self._totals["dropped"] + self._pending_rows
        while time.monotonic() < deadline:
            with self._lock:
                if self._totals["written"] + self._totals["dropped"] >= target:
                    return True
            time.sleep(min(0.01, self.flush_interval_s))
        return False

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop taking answers, write what is queued, publish what is open; what cannot be written
        within ``timeout_s`` is dropped, counted and logged."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        self._thread.join(timeout_s)
        lost = self._pending_rows
        if lost:
            with self._lock:
                self._totals["dropped"] += lost
            logger.error(
                "the answer log could not write its last %d answers to %s: %s",
                lost,
                self.destination.describe(),
                self._error or "it did not finish in time",
            )
        atexit.unregister(self.close)

    # ---- the writing thread -----------------------------------------------------------------

    def _run(self) -> None:
        # flushes start every interval, however long the last one took (a slow disk's fsync): what
        # a kill loses is what came since the last flush began, not an interval plus its length
        due = time.monotonic() + self.flush_interval_s
        while not self._closing.wait(max(due - time.monotonic(), 0.0)):
            self._flush()
            due = max(due + self.flush_interval_s, time.monotonic())
        # closing: write until nothing is left or a flush fails, then publish what is open
        while self._pending_rows and self._flush():
            pass
        if self._sink is not None:
            self._attempt(self._sink.close)

    def _flush(self) -> bool:
        """Write what is queued and let the sink publish what is due; False when it failed. A
        flush that failed is tried again as it was (same records, same number) before anything
        queued after it, so a sink can tell a retry from a new flush."""
        if self._sink is None and not self._attempt(self._open):
            return False
        sink = self._sink
        assert sink is not None  # opened above
        if self._inflight is None:
            with self._lock:
                batches = len(self._pending)
                taken = list(itertools.islice(self._pending, batches))
            if taken:
                try:
                    table = records.to_table(taken, self.session_id_key)
                except Exception:  # answers no table can hold: drop them, never retry forever
                    logger.exception("the answer log could not make records of %d answers", batches)
                    self._forget(batches, sum(a.rows for a in taken), written=False)
                    return False
                self._flushes += 1
                self._inflight = _Flush(self._flushes, batches, table)
        flush = self._inflight
        if flush is not None:
            if not self._attempt(lambda: sink.write(flush.table, flush.number)):
                return False
            self._inflight = None
            self._forget(flush.batches, flush.table.num_rows, written=True)
        return self._attempt(sink.tick)

    def _forget(self, batches: int, rows: int, *, written: bool) -> None:
        """Take the first ``batches`` queued answers (``rows`` records) off the queue."""
        with self._lock:
            for _ in range(batches):
                self._pending.popleft()
            self._pending_rows -= rows
            self._totals["written" if written else "dropped"] += rows

    def _attempt(self, action) -> bool:
        """Run ``action``; False (counted, its error kept for ``status``) when it fails."""
        try:
            action()
        except Exception as error:  # a full disk, Redis gone: retried at the next flush
            message = f"{type(error).__name__}: {error}"
            if message != self._error:
                logger.warning("the answer log cannot write to %s: %s", self._describe(), message)
            with self._lock:
                self._totals["failed_flushes"] += 1
                self._error = message
            return False
        if self._error:
            logger.warning("the answer log writes to %s again", self._describe())
            with self._lock:
                self._error = ""
        return True

    def _open(self) -> None:
        self._sink = open_sink(self.destination)

    def _describe(self) -> str:
        return self.destination.describe()


def open_sink(destination: Destination) -> Sink:
    """The object that writes to ``destination`` from this process."""
    if isinstance(destination, ParquetFolder):
        from merlin_torch_serving.answer_log.parquet_sink import FolderSink

        return FolderSink(destination)
    from merlin_torch_serving.answer_log.redis_sink import StreamSink

    return StreamSink(destination)
