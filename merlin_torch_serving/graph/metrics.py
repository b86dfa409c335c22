"""What the operators of a served step count while they run: sessions, filtered sessions,
out-of-vocabulary ids, fast-path fallbacks, time per operator, and what a multi-stage pipeline
answered around (candidates dropped, short answers, features answered with their defaults).

Operators call ``count(name, value, **labels)``; it costs a context-variable lookup and does
nothing unless a step host is ``collecting()`` (in-process runs collect nothing). The python
backend's host publishes what one request collected (``export.step_metrics``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

#: the counters, as ``count`` names them; published as ``mts_<name>_total``
SESSIONS = "sessions"
FILTERED_SESSIONS = "filtered_sessions"
OOV_IDS = "oov_ids"
FASTPATH_FALLBACKS = "fastpath_fallbacks"
OPERATOR_SECONDS = "operator_seconds"
#: multi-stage pipelines (``multistage``)
INVALID_CANDIDATES = "invalid_candidates"
EXCLUDED_CANDIDATES = "excluded_candidates"
SHORT_ANSWERS = "short_answers"
EMPTY_ANSWERS = "empty_answers"
MISSING_ENTITIES = "missing_entities"
UNANSWERED_ENTITIES = "unanswered_entities"
FEATURE_SERVER_ERRORS = "feature_server_errors"
#: a route's branches (``routing``): calls, seconds inside them, sessions they failed
BRANCH_CALLS = "branch_calls"
BRANCH_SECONDS = "branch_seconds"
BRANCH_ERRORS = "branch_errors"
#: stores of state kept between requests (``stores``, ``live``): calls that failed or were
#: skipped, and clicks answered from the request alone because the store did not take them
STORE_ERRORS = "store_errors"
UNSTORED_CLICKS = "unstored_clicks"
#: the answer log (``answer_log``): records written, dropped (its queue full while its
#: destination failed) and flushes that failed
ANSWER_LOG_WRITTEN = "answer_log_written"
ANSWER_LOG_DROPPED = "answer_log_dropped"
ANSWER_LOG_FAILED_FLUSHES = "answer_log_failed_flushes"

Key = tuple[str, tuple[tuple[str, str], ...]]


class Collected:
    """Counts of one request: (name, sorted labels) -> total."""

    def __init__(self):
        self.totals: dict[Key, float] = {}

    def add(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._add((name, tuple(sorted(labels.items()))), value)

    def merge(self, other: Collected) -> None:
        for key, value in other.totals.items():
            self._add(key, value)

    def _add(self, key: Key, value: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + value


_collected: contextvars.ContextVar[Collected | None] = contextvars.ContextVar(
    "mts_collected", default=None
)


def count(name: str, value: float = 1, **labels: str) -> None:
    """Add ``value`` to counter ``name`` of the request being served.

    Outside a served step, this does nothing.
    """
    collected = _collected.get()
    if collected is not None and value:
        collected.add(name, float(value), labels)


def counted(name: str) -> float:
    """What counter ``name`` holds so far for the request being served, over all its labels."""
    collected = _collected.get()
    if collected is None:
        return 0.0
    return sum(value for (key, _), value in collected.totals.items() if key == name)


def is_collecting() -> bool:
    """Whether counts are kept: lets an operator skip work done only to count."""
    return _collected.get() is not None


@contextlib.contextmanager
def collecting() -> Iterator[Collected]:
    collected = Collected()
    token = _collected.set(collected)
    try:
        yield collected
    finally:
        _collected.reset(token)


@contextlib.contextmanager
def tentative() -> Iterator[Callable[[], None]]:
    """Counts made inside reach the request being served only if the ``keep`` it yields is
    called at the end: work that may be thrown away and redone (a merged run of several
    requests that fails is run again request by request) must not count twice."""
    outer = _collected.get()
    if outer is None:
        yield lambda: None
        return
    with collecting() as inner:
        yield lambda: outer.merge(inner)
