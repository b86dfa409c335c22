"""One answer row per request session: the workflow's rows lined up with the sessions of the
request, in the order they first appear, and a placeholder row for each session the workflow's
filters dropped (a one-click session under ``Filter(count >= 2)``), marked in a bool column.

Placeholder rows hold the session's key, empty lists, and zeros (or empty strings); every later
operator runs on them like on any row, and the ensemble blanks what it computed from them (see
``ops.filtered``), so a request never fails because the workflow filtered one of its sessions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving.data.tables import concat, num_rows, take_rows

FILTERED_COLUMN = "filtered_out"


def line_up_sessions(
    table: TensorTable,
    request_keys: np.ndarray,
    key: str,
    filtered_column: str | None,
    unfiltered: Callable[[np.ndarray], TensorTable] | None = None,
) -> TensorTable:
    """``table``'s rows, one per distinct key of ``request_keys`` in first-appearance order.

    With ``filtered_column``, sessions missing from ``table`` get a placeholder row and the column
    is True on them; without it a missing session is an error (nothing could mark its row).
    ``unfiltered(keys)``, when given, computes the rows of missing sessions to use as their
    placeholders (sessions it has no row for keep empty ones).
    """
    request_keys = np.asarray(request_keys)
    distinct, first_position = np.unique(request_keys, return_index=True)
    answer_keys = distinct[np.argsort(first_position, kind="stable")]
    output_keys = np.asarray(table[key].values)
    rows = _row_of_each_key(output_keys, answer_keys)
    unknown = np.setdiff1d(output_keys, answer_keys)
    if len(unknown):
        raise ValueError(
            f"the workflow answered for {key!r} values the request did not send"
            f" ({unknown[:5].tolist()}); it changes the key it groups by, so its sessions cannot be"
            " matched to the request's. Pass TransformWorkflow(..., keep_request_order=False) to"
            " take its rows as they come"
        )
    missing = rows < 0
    if missing.any() and filtered_column is None:
        raise ValueError(
            f"the workflow dropped the session(s) {answer_keys[missing][:5].tolist()} although it"
            " has no Filter; every session of a request needs a row"
        )
    if missing.any():
        keys = answer_keys[missing]
        placeholders = _placeholders(table, key, keys)
        if unfiltered is not None:
            computed = unfiltered(keys)
            found = _row_of_each_key(np.asarray(computed[key].values), keys)
            empty = num_rows(computed) + np.arange(len(keys))
            both = concat([computed, placeholders])
            placeholders = take_rows(both, np.where(found >= 0, found, empty))
        table = concat([table, placeholders])
        rows[missing] = len(output_keys) + np.arange(int(missing.sum()))
    lined_up = take_rows(table, rows)
    if filtered_column is None:
        return lined_up
    return TensorTable({**dict(lined_up.items()), filtered_column: missing}, _unsafe=True)


def _row_of_each_key(output_keys: np.ndarray, answer_keys: np.ndarray) -> np.ndarray:
    """For each answer key, its row in ``output_keys``; -1 where it has none."""
    order = np.argsort(output_keys, kind="stable")
    sorted_keys = output_keys[order]
    positions = np.clip(np.searchsorted(sorted_keys, answer_keys), 0, max(len(sorted_keys) - 1, 0))
    found = np.zeros(len(answer_keys), dtype=bool)
    if len(sorted_keys):
        found = sorted_keys[positions] == answer_keys
    return np.where(found, order[positions] if len(order) else -1, -1).astype(np.int64)


def _placeholders(table: TensorTable, key: str, keys: np.ndarray) -> TensorTable:
    """One row per key, with ``table``'s columns: the key, empty lists, zeros or empty strings."""
    count = len(keys)
    columns: dict[str, object] = {}
    for name, column in table.items():
        values = np.asarray(column.values)
        if column.offsets is not None:
            columns[name] = (
                values[:0],
                np.zeros(count + 1, dtype=np.asarray(column.offsets).dtype),
            )
            continue
        if name == key:
            columns[name] = keys.astype(values.dtype, copy=False)
        elif values.dtype == np.dtype(object):
            columns[name] = np.full((count, *values.shape[1:]), "", dtype=object)
        else:
            columns[name] = np.zeros((count, *values.shape[1:]), dtype=values.dtype)
    return TensorTable(columns, _unsafe=True)
