"""The one interface of every store of state kept between requests: a session's clicks, rules
(block lists), and trending counts; ``EmbeddedStore`` (SQLite) and ``RedisStore`` implement it.

What a store promises, whichever it is:

- a click is stored once: its ``key`` names it, and a click whose key the session already holds
  (a request retried, or sent again by a failover) stores nothing and counts nothing;
- a session's clicks come back in timestamp order, ties in the order they arrived, however many
  processes append to it at once; the session expires ``ttl_s`` after its last append;
- trending counts are integers per item and time bucket, so counts kept as clicks arrive equal
  the same counts recomputed in batch;
- every call is bounded by the settings' timeout and raises ``StoreError`` when it fails.

Session ids and item ids are text in a store (``text_key``): the same id written by any process,
in any dtype of one column, names the same session or item.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from merlin_torch_serving.stores.settings import StoreSettings


@dataclass(frozen=True)
class Click:
    """One click to append to a session."""

    #: its identity: a click whose key the session holds is not stored again
    key: bytes
    #: orders the session's clicks (ties keep the order the clicks arrived in)
    timestamp: float
    #: the click itself, as its writer encoded it; handed back as it was
    payload: bytes
    #: the item counted for trending (None: not counted), in its time bucket
    item: str | None = None
    bucket: int = 0


@dataclass(frozen=True)
class TrendingCounts:
    """Clicks per item per time bucket, of the ``window`` buckets up to the latest one a click
    fell in (``latest`` is None while nothing was counted)."""

    latest: int | None
    #: bucket -> item -> clicks
    buckets: dict[int, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class TrendingWindow:
    """Which counts an append adds to: trending ``name``, whose buckets older than ``window``
    before the latest are dropped."""

    name: str
    window: int


class Store(abc.ABC):
    """A store of sessions, rules and trending counts (see the module's docstring)."""

    settings: StoreSettings

    # ---- sessions ----------------------------------------------------------------------------

    @abc.abstractmethod
    def append(
        self,
        clicks: Mapping[str, Sequence[Click]],
        *,
        keep: int,
        ttl_s: float,
        trending: TrendingWindow | None = None,
    ) -> dict[str, list[bytes]]:
        """Append each session's new clicks (those whose key it does not hold yet), count the
        new ones for ``trending``, and return each session's last ``keep`` clicks (payloads, in
        order) once they are in; the sessions expire ``ttl_s`` after this call."""

    @abc.abstractmethod
    def clicks(self, session: str, keep: int | None = None) -> list[bytes]:
        """The session's stored clicks (its last ``keep``), oldest first; [] when none."""

    @abc.abstractmethod
    def forget(self, session: str) -> bool:
        """Remove everything stored about the session; whether anything was."""

    @abc.abstractmethod
    def count_sessions(self) -> int:
        """How many sessions hold clicks that have not expired (a scan: for tools, not serving)."""

    # ---- rules -------------------------------------------------------------------------------

    @abc.abstractmethod
    def block(self, rule_list: str, items: Iterable[str]) -> int:
        """Add items to a block list; how many were not on it."""

    @abc.abstractmethod
    def unblock(self, rule_list: str, items: Iterable[str]) -> int:
        """Take items off a block list; how many were on it."""

    @abc.abstractmethod
    def blocked(self, rule_list: str) -> list[str]:
        """The items of a block list, sorted."""

    @abc.abstractmethod
    def rule_lists(self) -> list[str]:
        """The names of the block lists that hold an item, sorted."""

    def replace_blocked(self, rule_list: str, items: Iterable[str]) -> None:
        """Make the block list hold exactly ``items``."""
        wanted = set(items)
        current = set(self.blocked(rule_list))
        self.block(rule_list, sorted(wanted - current))
        self.unblock(rule_list, sorted(current - wanted))

    # ---- trending ----------------------------------------------------------------------------

    @abc.abstractmethod
    def trending_counts(self, name: str, window: int) -> TrendingCounts:
        """The counts of trending ``name`` in the ``window`` buckets up to its latest."""

    # ---- the store itself --------------------------------------------------------------------

    @abc.abstractmethod
    def ping(self) -> None:
        """Return when the store answers; ``StoreError`` when it does not."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close its connections (a later call opens them again)."""

    def describe(self) -> str:
        return self.settings.describe()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def text_key(value) -> str:
    """An id as a store keeps it: ints (of any width) as decimal text, floats that are whole as
    ints, text as it is."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str | np.str_):
        return str(value)
    if isinstance(value, bool | np.bool_):
        return str(int(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def check_window(window: int) -> int:
    if int(window) < 1:
        raise ValueError(f"a trending window holds at least one bucket, got {window!r}")
    return int(window)
