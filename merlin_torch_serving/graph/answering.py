"""Whom a run of a plan answers: the served requests it computes (their ids and how many answer
rows each has, with the exported model that answers them), batch scoring, or a call in this
process (nothing set). Warm-up runs are ``rehearsal``'s: whatever they answer is nobody's.

The python-backend host sets it around each run; operators that record what was answered (the
answer log) read it. Like ``metrics``, a context variable: free when nobody sets it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: what a run answers
SERVED = "served"  # requests a client sent, answered by a served step
SCORING = "scoring"  # batch scoring of a dataset: answers go to files, not to anyone's screen


@dataclass(frozen=True)
class Answering:
    """What one run of a plan answers.

    ``request_ids``: one per request of the run (Triton's request id, ``""`` when the client sent
    none), in row order; ``answer_rows``: how many rows of the run's answer belong to each (None:
    every row to the one request). ``ensemble`` and ``ensemble_version``: the ensemble the step was
    exported into, and its version then; ``model`` and ``version``: the step model that runs it,
    as the server loaded it (empty and 0 outside a server).
    """

    kind: str
    request_ids: tuple[str, ...] = ()
    answer_rows: tuple[int, ...] | None = None
    ensemble: str = ""
    ensemble_version: int = 0
    model: str = ""
    version: int = 0

    @property
    def seen_by_someone(self) -> bool:
        """Whether the answers are shown to someone (served requests)."""
        return self.kind == SERVED

    def for_requests(self, indices: Sequence[int], answer_rows: Sequence[int]) -> Answering:
        """The same, narrowed to the requests at ``indices`` whose answers have ``answer_rows``
        rows each (one merged run of a batch)."""
        ids = tuple(self.request_ids[index] for index in indices)
        rows = tuple(answer_rows) if len(indices) > 1 else None
        return dataclasses.replace(self, request_ids=ids, answer_rows=rows)


_answering: contextvars.ContextVar[Answering | None] = contextvars.ContextVar(
    "mts_answering", default=None
)


def current() -> Answering | None:
    """What the run in progress answers; None for a call in this process (``transform``)."""
    return _answering.get()


@contextlib.contextmanager
def answering(what: Answering | None) -> Iterator[None]:
    """Runs inside answer ``what`` (None: leave what is set as it is)."""
    if what is None:
        yield
        return
    token = _answering.set(what)
    try:
        yield
    finally:
        _answering.reset(token)
