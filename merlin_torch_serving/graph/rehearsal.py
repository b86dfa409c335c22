"""Runs that rehearse rather than serve: the run of the plan an export captures warm-up inputs
from, and the warm-up requests a served step answers while it loads. Operators with effects
outside the request (appending clicks to a store) leave the store alone during one, and so do
those that read one (the export's machine may not reach the serving store)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_rehearsing: contextvars.ContextVar[bool] = contextvars.ContextVar("mts_rehearsing", default=False)


def is_rehearsal() -> bool:
    """Whether the run at hand is a rehearsal (see the module's docstring)."""
    return _rehearsing.get()


@contextlib.contextmanager
def rehearsing(active: bool = True) -> Iterator[None]:
    token = _rehearsing.set(active)
    try:
        yield
    finally:
        _rehearsing.reset(token)
