"""The embedded store: one SQLite file in WAL mode in a folder of this machine, needing no service.

Every process that opens the folder shares the store (the stubs of a server, several servers,
the command line); SQLite's write lock orders concurrent appends, WAL lets reads go on beside a
write, and the file outlives every process. A call waits at most ``timeout_s`` for another
process's write (SQLite's busy timeout), then fails with ``StoreError``.

A session keeps all its clicks until it expires (reads take the last ``keep`` through an index);
an expired session reads as empty, loses its clicks at its next append, and is swept from the file
once a minute by the process that appends.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

from merlin_torch_serving.exceptions import StoreError
from merlin_torch_serving.stores.base import (
    Click,
    Store,
    TrendingCounts,
    TrendingWindow,
    check_window,
)
from merlin_torch_serving.stores.settings import EmbeddedSettings

#: how often an appending process sweeps expired sessions and old trending buckets
SWEEP_INTERVAL_S = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS clicks (
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    key BLOB NOT NULL,
    ts REAL NOT NULL,
    payload BLOB NOT NULL,
    UNIQUE (session, key)
);
CREATE INDEX IF NOT EXISTS clicks_in_order ON clicks (session, ts, id);
CREATE TABLE IF NOT EXISTS sessions (session TEXT PRIMARY KEY, expires REAL NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rules (list TEXT NOT NULL, item TEXT NOT NULL, PRIMARY KEY (list, item))
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trending (
    name TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    item TEXT NOT NULL,
    clicks INTEGER NOT NULL,
    PRIMARY KEY (name, bucket, item)
) WITHOUT ROWID;
"""


class EmbeddedStore(Store):
    """The store in ``settings.folder`` (see the module's docstring); thread-safe."""

    settings: EmbeddedSettings

    def __init__(self, settings: EmbeddedSettings):
        self.settings = settings
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._swept = 0.0

    # ---- sessions ----------------------------------------------------------------------------

    def append(
        self,
        clicks: Mapping[str, Sequence[Click]],
        *,
        keep: int,
        ttl_s: float,
        trending: TrendingWindow | None = None,
    ) -> dict[str, list[bytes]]:
        now = time.time()
        with self._transaction() as db:
            stored = {}
            for session, new in clicks.items():
                _drop_if_expired(db, session, now)
                for click in new:
                    inserted = db.execute(
                        "INSERT OR IGNORE INTO clicks (session, key, ts, payload) VALUES (?,?,?,?)",
                        (session, click.key, float(click.timestamp), click.payload),
                    ).rowcount
                    if inserted and trending is not None and click.item is not None:
                        db.execute(
                            "INSERT INTO trending VALUES (?,?,?,1) ON CONFLICT (name, bucket, item)"
                            " DO UPDATE SET clicks = clicks + 1",
                            (trending.name, int(click.bucket), click.item),
                        )
                db.execute(
                    "INSERT INTO sessions VALUES (?,?) ON CONFLICT (session) DO UPDATE"
                    " SET expires = excluded.expires",
                    (session, now + float(ttl_s)),
                )
                stored[session] = _last(db, session, keep)
            if now - self._swept > SWEEP_INTERVAL_S:
                self._swept = now
                _sweep(db, now, trending)
        return stored

    def clicks(self, session: str, keep: int | None = None) -> list[bytes]:
        with self._transaction(write=False) as db:
            if _expired(db, session, time.time()):
                return []
            return _last(db, session, keep)

    def forget(self, session: str) -> bool:
        with self._transaction() as db:
            removed = db.execute("DELETE FROM clicks WHERE session = ?", (session,)).rowcount
            removed += db.execute("DELETE FROM sessions WHERE session = ?", (session,)).rowcount
        return removed > 0

    def count_sessions(self) -> int:
        with self._transaction(write=False) as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM sessions WHERE expires >= ?", (time.time(),)
            ).fetchone()
        return int(count)

    # ---- rules -------------------------------------------------------------------------------

    def block(self, rule_list: str, items: Iterable[str]) -> int:
        with self._transaction() as db:
            return sum(
                db.execute("INSERT OR IGNORE INTO rules VALUES (?,?)", (rule_list, item)).rowcount
                for item in items
            )

    def unblock(self, rule_list: str, items: Iterable[str]) -> int:
        with self._transaction() as db:
            return sum(
                db.execute(
                    "DELETE FROM rules WHERE list = ? AND item = ?", (rule_list, item)
                ).rowcount
                for item in items
            )

    def blocked(self, rule_list: str) -> list[str]:
        with self._transaction(write=False) as db:
            rows = db.execute("SELECT item FROM rules WHERE list = ?", (rule_list,)).fetchall()
        return sorted(item for (item,) in rows)

    def rule_lists(self) -> list[str]:
        with self._transaction(write=False) as db:
            rows = db.execute("SELECT DISTINCT list FROM rules").fetchall()
        return sorted(name for (name,) in rows)

    # ---- trending ----------------------------------------------------------------------------

    def trending_counts(self, name: str, window: int) -> TrendingCounts:
        window = check_window(window)
        with self._transaction(write=False) as db:
            (latest,) = db.execute(
                "SELECT MAX(bucket) FROM trending WHERE name = ?", (name,)
            ).fetchone()
            if latest is None:
                return TrendingCounts(None)
            rows = db.execute(
                "SELECT bucket, item, clicks FROM trending WHERE name = ? AND bucket > ?",
                (name, latest - window),
            ).fetchall()
        buckets: dict[int, dict[str, int]] = {}
        for bucket, item, count in rows:
            buckets.setdefault(int(bucket), {})[item] = int(count)
        return TrendingCounts(int(latest), buckets)

    # ---- the store itself --------------------------------------------------------------------

    def ping(self) -> None:
        with self._transaction(write=False) as db:
            db.execute("SELECT 1").fetchone()

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _transaction(self, write: bool = True) -> _Transaction:
        return _Transaction(self, write)

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            path = self.settings.path
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                connection = sqlite3.connect(
                    path,
                    timeout=self.settings.timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
                connection.execute("PRAGMA journal_mode = WAL")
                connection.execute("PRAGMA synchronous = NORMAL")
                connection.executescript(SCHEMA)
            except (OSError, sqlite3.Error) as error:
                raise StoreError(
                    path, f"{type(error).__name__}: {error}", _hint(path, error)
                ) from error
            self._connection = connection
        return self._connection


class _Transaction:
    """One transaction under the store's lock: ``BEGIN IMMEDIATE`` (the write lock, waited for at
    most the timeout) for writes, a plain one for reads; sqlite errors become ``StoreError``."""

    def __init__(self, store: EmbeddedStore, write: bool):
        self._store = store
        self._write = write

    def __enter__(self) -> sqlite3.Connection:
        self._store._lock.acquire()
        try:
            self._db = self._store._connect()
            self._db.execute("BEGIN IMMEDIATE" if self._write else "BEGIN")
        except sqlite3.Error as error:
            self._store._lock.release()
            raise self._failed(error) from error
        except BaseException:
            self._store._lock.release()
            raise
        return self._db

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is None:
                self._db.execute("COMMIT")
            elif self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error as failure:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise self._failed(failure) from failure
        finally:
            self._store._lock.release()
        if isinstance(error, sqlite3.Error):
            raise self._failed(error) from error

    def _failed(self, error: sqlite3.Error) -> StoreError:
        path = self._store.settings.path
        return StoreError(path, f"{type(error).__name__}: {error}", _hint(path, error))


def _hint(path: str, error: BaseException) -> str:
    if "locked" in str(error):
        return (
            "another process held its write lock past timeout_s; raise timeout_s if writes are"
            " long, or look for a process keeping a transaction open"
        )
    return f"check that {os.path.dirname(path)!r} exists and is writable"


def _last(db: sqlite3.Connection, session: str, keep: int | None) -> list[bytes]:
    rows = db.execute(
        "SELECT payload FROM clicks WHERE session = ? ORDER BY ts DESC, id DESC LIMIT ?",
        (session, -1 if keep is None else int(keep)),
    ).fetchall()
    return [bytes(payload) for (payload,) in reversed(rows)]


def _expired(db: sqlite3.Connection, session: str, now: float) -> bool:
    row = db.execute("SELECT expires FROM sessions WHERE session = ?", (session,)).fetchone()
    return row is None or row[0] < now


def _drop_if_expired(db: sqlite3.Connection, session: str, now: float) -> None:
    row = db.execute("SELECT expires FROM sessions WHERE session = ?", (session,)).fetchone()
    if row is not None and row[0] < now:
        db.execute("DELETE FROM clicks WHERE session = ?", (session,))


def _sweep(db: sqlite3.Connection, now: float, trending: TrendingWindow | None) -> None:
    """Drop the clicks of expired sessions, and trending buckets out of the window."""
    db.execute(
        "DELETE FROM clicks WHERE session IN (SELECT session FROM sessions WHERE expires < ?)",
        (now,),
    )
    db.execute("DELETE FROM sessions WHERE expires < ?", (now,))
    if trending is not None:
        db.execute(
            "DELETE FROM trending WHERE name = ? AND bucket <="
            " (SELECT MAX(bucket) FROM trending WHERE name = ?) - ?",
            (trending.name, trending.name, trending.window),
        )
