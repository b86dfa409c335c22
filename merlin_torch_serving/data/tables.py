"""Row operations on ``TensorTable``s, ragged columns included.

They are shared by the operators and the client.
"""

from __future__ import annotations

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving.data import wire


def num_rows(table: TensorTable) -> int:
    """Rows of the table (of its first column; 0 for a table without columns)."""
    for name in table.columns:
        column = table[name]
        return len(column.offsets) - 1 if column.offsets is not None else len(column.values)
    return 0


def take_rows(table: TensorTable, rows: np.ndarray) -> TensorTable:
    """The given rows of every column, in the given order (ragged columns included)."""
    columns = {}
    for name, column in table.items():
        if column.offsets is None:
            columns[name] = np.asarray(column.values)[rows]
        else:
            columns[name] = wire.take_ragged(column.values, column.offsets, rows)
    return TensorTable(columns, _unsafe=True)


def concat(tables: list[TensorTable]) -> TensorTable:
    """The rows of ``tables`` one after the other (they share their columns)."""
    if len(tables) == 1:
        return tables[0]
    columns = {}
    for name in tables[0].columns:
        parts = [table[name] for table in tables]
        values = np.concatenate([np.asarray(part.values) for part in parts])
        if parts[0].offsets is None:
            columns[name] = values
            continue
        lengths = np.concatenate([np.diff(np.asarray(part.offsets)) for part in parts])
        columns[name] = (values, wire.offsets_from_lengths(lengths))
    return TensorTable(columns, _unsafe=True)
