"""The answer log's record: one row per answered session, and how the answers an operator took
while serving become those rows (an Arrow table), off the request's path.

    request_id        string     the request's id (Triton's; made up when the client sent none)
    session_id        int64|str  the session (hex of a keyed BLAKE2b when ids are hashed)
    answered_at       timestamp  when the answer was made (UTC, microseconds)
    ensemble          string     the ensemble answered through, and the version it was exported as
    ensemble_version  int64
    model             string     the step model that answered and logged, as the server loaded it
    model_version     int64
    branch            string     the route's branch that answered (null without a route)
    variant           string     the session's variant in the route's experiment (null without)
    item_ids          list       the items shown, in order (as answered: raw or encoded ids)
    scores            list       their scores
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from merlin_torch_serving.graph.answering import Answering

#: the digest size of a hashed session id, in bytes (32 hex characters)
HASH_BYTES = 16
#: the record's columns for a log of integer session and item ids (as a log with no answer reads)
EMPTY = pa.schema(
    [
        ("request_id", pa.string()),
        ("session_id", pa.int64()),
        ("answered_at", pa.timestamp("us", tz="UTC")),
        ("ensemble", pa.string()),
        ("ensemble_version", pa.int64()),
        ("model", pa.string()),
        ("model_version", pa.int64()),
        ("branch", pa.string()),
        ("variant", pa.string()),
        ("item_ids", pa.list_(pa.int64())),
        ("scores", pa.list_(pa.float32())),
    ]
)


@dataclass(frozen=True)
class Answers:
    """What one run answered, copied out of the request's buffers (they are gone once the request
    is): per session its id, shown items and scores, and (with a route) branch and variant."""

    answered_at_ns: int
    whom: Answering | None
    #: per session, the index of its request in ``whom.request_ids`` (None: all of the first)
    owners: np.ndarray | None
    session_ids: np.ndarray
    #: ``[sessions, k]`` (fixed-length lists) or the flat values of ragged ones with ``offsets``
    item_ids: np.ndarray
    scores: np.ndarray
    offsets: np.ndarray | None = None
    #: items shown per session (the rest of a fixed-length list is padding), None: all
    counts: np.ndarray | None = None
    branches: np.ndarray | None = None
    variants: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.session_ids)


def taken(
    whom: Answering | None,
    owners: np.ndarray | None,
    kept: np.ndarray | None,
    session_ids: np.ndarray,
    items,
    scores,
    count: np.ndarray | None = None,
    branch: np.ndarray | None = None,
    variant: np.ndarray | None = None,
) -> Answers:
    """``Answers`` of the sessions at ``kept`` (None: all), copied, stamped with the time now.
    ``items`` and ``scores`` are the answer's list columns (their ``values`` and ``offsets``)."""

    def rows_of(array):
        if array is None:
            return None
        return np.array(array, copy=True) if kept is None else np.asarray(array)[kept]

    item_values, score_values = np.asarray(items.values), np.asarray(scores.values)
    offsets = None if items.offsets is None else np.asarray(items.offsets).astype(np.int64)
    if offsets is None:
        item_values, score_values = rows_of(item_values), rows_of(score_values)
    elif kept is None:
        item_values, score_values = item_values.copy(), score_values.copy()
    else:
        lengths = np.diff(offsets)
        chosen = np.repeat(np.isin(np.arange(len(lengths)), kept), lengths)
        item_values, score_values = item_values[chosen], score_values[chosen]
        offsets = np.concatenate([[0], np.cumsum(lengths[kept])])
    return Answers(
        time.time_ns(),
        whom,
        rows_of(owners),
        rows_of(session_ids),
        item_values,
        score_values,
        offsets,
        rows_of(count),
        rows_of(branch),
        rows_of(variant),
    )


def session_hash(session_ids, key: str) -> np.ndarray:
    """Each session id as the hex of its BLAKE2b keyed with ``key``: the same id gives the same hash
    under the same key, and without the key a hash cannot be matched to a guessed id."""
    secret = key.encode()
    return np.array(
        [
            hashlib.blake2b(str(value).encode(), key=secret, digest_size=HASH_BYTES).hexdigest()
            for value in np.asarray(session_ids).tolist()
        ],
        dtype=object,
    )


def to_table(batches: list[Answers], session_id_key: str | None = None) -> pa.Table:
    """The records of ``batches``, in order: each batch's columns made with numpy, then each
    column made once for all of them (a flush holds many small batches, one per request)."""
    parts = [_columns(batch) for batch in batches]

    def joined(name):
        return np.concatenate([part[name] for part in parts])

    sessions = joined("session_id")
    if session_id_key:
        sessions = session_hash(sessions, session_id_key)
    offsets = np.concatenate([[0], np.cumsum(joined("shown"))]).astype(np.int32)
    text = pa.string()
    return pa.table(
        {
            "request_id": pa.array(joined("request_id"), text),
            "session_id": _session_array(sessions),
            "answered_at": pa.array(joined("answered_at"), pa.timestamp("us", tz="UTC")),
            "ensemble": pa.array(joined("ensemble"), text),
            "ensemble_version": pa.array(joined("ensemble_version"), pa.int64()),
            "model": pa.array(joined("model"), text),
            "model_version": pa.array(joined("model_version"), pa.int64()),
            "branch": pa.array(joined("branch"), text),
            "variant": pa.array(joined("variant"), text),
            "item_ids": pa.ListArray.from_arrays(pa.array(offsets), _values(joined("item_ids"))),
            "scores": pa.ListArray.from_arrays(pa.array(offsets), pa.array(joined("scores"))),
        }
    )


def _columns(batch: Answers) -> dict[str, np.ndarray]:
    """A batch's columns as numpy arrays, the lists flat with the number of items of each row."""
    rows = batch.rows
    whom = batch.whom or Answering("")
    items, scores, shown = _shown(batch)
    return {
        "request_id": _request_ids(whom, batch.owners, rows),
        "session_id": batch.session_ids.reshape(-1),
        "answered_at": np.full(rows, batch.answered_at_ns // 1000, dtype=np.int64),
        "ensemble": np.full(rows, whom.ensemble, dtype=object),
        "ensemble_version": np.full(rows, whom.ensemble_version, dtype=np.int64),
        "model": np.full(rows, whom.model, dtype=object),
        "model_version": np.full(rows, whom.version, dtype=np.int64),
        "branch": _labels(batch.branches, rows),
        "variant": _labels(batch.variants, rows),
        "item_ids": items,
        "scores": scores,
        "shown": shown,
    }


def _request_ids(whom: Answering, owners: np.ndarray | None, rows: int) -> np.ndarray:
    """One id per row: its request's own (a new one for a request sent without)."""
    ids = [request_id or uuid.uuid4().hex for request_id in whom.request_ids] or [uuid.uuid4().hex]
    if owners is None:
        return np.full(rows, ids[0], dtype=object)
    return np.array(ids, dtype=object)[owners]


def _shown(batch: Answers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The items shown to each session and their scores, flat, and how many each row has."""
    ids, scores = batch.item_ids, batch.scores
    if batch.offsets is not None:
        return ids, scores, np.diff(batch.offsets)
    width = ids.shape[1] if ids.ndim > 1 else 1
    ids, scores = ids.reshape(batch.rows, width), scores.reshape(batch.rows, width)
    if batch.counts is None:
        return ids.reshape(-1), scores.reshape(-1), np.full(batch.rows, width)
    counts = np.clip(batch.counts.reshape(-1), 0, width)
    kept = np.arange(width)[np.newaxis, :] < counts[:, np.newaxis]
    return ids[kept], scores[kept], counts


def _values(ids: np.ndarray) -> pa.Array:
    if ids.dtype == object:
        return pa.array(ids, pa.string())
    return pa.array(ids.astype(np.int64, copy=False))


def _session_array(sessions: np.ndarray) -> pa.Array:
    if sessions.dtype == object or sessions.dtype.kind in "US":
        return pa.array(sessions.astype(str, copy=False).astype(object), pa.string())
    return pa.array(sessions.astype(np.int64, copy=False))


def _labels(values: np.ndarray | None, rows: int) -> np.ndarray:
    """A route's labels, or nulls without a route."""
    if values is None:
        return np.full(rows, None, dtype=object)
    return values.reshape(-1).astype(object, copy=False)
