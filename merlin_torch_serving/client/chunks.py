"""Cutting a big request into requests of at most ``max_rows`` rows without cutting a session.

A session-based ensemble turns all clicks of a session into one answer row, so the clicks of a
session must travel together: rows are grouped by the columns the ensemble declares
(``Plan.request_groups``, the session id), groups are kept in the order they first appear, and
whole groups are packed into chunks. The answers of the chunks, concatenated, come in the same
order as the answer to the whole request would.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving.data.tables import num_rows, take_rows
from merlin_torch_serving.data.wire import TableColumn, table_columns

#: a request's columns by name, as a client builds them (a ragged list as ``(values, offsets)``)
Columns = dict[str, TableColumn]


def split_columns(
    columns: Columns, group_columns: Sequence[str] | None, max_rows: int | None
) -> list[Columns]:
    """``split`` of a request held as columns; a request that fits (nearly every one) is returned
    as it is, without building a table."""
    if max_rows is None or group_columns is None or columns_size(columns) <= max_rows:
        return [columns]
    return [
        table_columns(part)
        for part in split(TensorTable(columns, _unsafe=True), group_columns, max_rows)
    ]


def columns_rows(columns: Columns) -> int:
    """Rows of a request held as columns (of its first column; 0 without columns)."""
    for column in columns.values():
        return len(column[1]) - 1 if isinstance(column, tuple) else len(column)
    return 0


def columns_size(columns: Columns) -> int:
    """The longest first dimension among the tensors a request held as columns travels as."""
    sizes = [len(column[0] if isinstance(column, tuple) else column) for column in columns.values()]
    return max([*sizes, columns_rows(columns)])


def split(
    table: TensorTable, group_columns: Sequence[str] | None, max_rows: int | None
) -> Iterator[TensorTable]:
    """The request in chunks whose tensors hold at most ``max_rows`` rows each (each value of a
    ragged list counts as a row, as the server counts them), never splitting a group of rows that
    share their ``group_columns`` values. ``group_columns=None`` means the request must not be
    split; ``[]`` that every row stands alone. A single group bigger than ``max_rows`` becomes a
    chunk of its own (the server then says it is too big)."""
    rows = num_rows(table)
    if max_rows is None or group_columns is None or rows == 0 or _size(table) <= max_rows:
        yield table
        return
    order, group_starts = _groups(table, group_columns)
    weights = _row_weights(table)[order]
    cumulative = np.concatenate([[0], np.cumsum(weights)])[group_starts]  # weight before each group
    start = 0
    while start < len(group_starts) - 1:
        end = int(np.searchsorted(cumulative, cumulative[start] + max_rows, side="right")) - 1
        end = max(end, start + 1)
        yield take_rows(table, order[group_starts[start] : group_starts[end]])
        start = end


def _groups(table: TensorTable, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Row order that puts each group's rows together (groups by first appearance, rows in their
    order), and where each group starts in it (with the row count appended)."""
    rows = num_rows(table)
    if not columns:
        return np.arange(rows), np.arange(rows + 1)
    keys = (
        pd.MultiIndex.from_arrays([np.asarray(table[name].values) for name in columns])
        if len(columns) > 1
        else pd.Index(np.asarray(table[columns[0]].values))
    )
    codes, _ = pd.factorize(keys, sort=False)  # numbered by first appearance
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.diff(sorted_codes, prepend=-1) != 0)
    return order, np.append(starts, rows)


def _row_weights(table: TensorTable) -> np.ndarray:
    """Per row, the most rows it adds to any one tensor: 1, or the length of its longest list."""
    weights = np.ones(num_rows(table), dtype=np.int64)
    for column in table.columns:
        data = table[column]
        if data.offsets is not None:
            weights = np.maximum(weights, np.diff(np.asarray(data.offsets)).astype(np.int64))
    return weights


def _size(table: TensorTable) -> int:
    """The longest first dimension among the request's tensors."""
    sizes = [len(np.asarray(table[name].values)) for name in table.columns]
    return max(sizes + [num_rows(table)])
