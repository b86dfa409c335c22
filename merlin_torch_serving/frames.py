"""Conversions between pandas DataFrames (one row per record, list cells for list columns) and
``TensorTable``s (values/offsets for ragged lists, 2-D arrays for fixed-length lists)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from merlin.table import TensorTable

from merlin_torch_serving import wire


def table_to_frame(table: TensorTable) -> pd.DataFrame:
    """One DataFrame column per table column; list columns hold one numpy array per row."""
    data = {}
    for name, column in table.items():
        values = np.asarray(column.values)
        if column.offsets is not None:
            offsets = np.asarray(column.offsets)
            data[name] = _object_column(np.split(values, offsets[1:-1]) if len(offsets) > 1 else [])
        elif values.ndim > 1:
            data[name] = _object_column(list(values))
        else:
            data[name] = values
    return pd.DataFrame(data)


def frame_to_table(frame: pd.DataFrame | Mapping[str, object]) -> TensorTable:
    """A table from a DataFrame or a dict of columns; list cells become ragged columns."""
    columns = {}
    for name, series in (frame.items() if isinstance(frame, pd.DataFrame) else frame.items()):
        values = series.to_numpy() if isinstance(series, pd.Series) else series
        if is_list_column(values):
            columns[name] = ragged_from_lists(values)
        else:
            columns[name] = np.asarray(values)
    return TensorTable(columns, _unsafe=True)


def is_list_column(values) -> bool:
    """Whether a column holds one list (or array) per row rather than one value."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return False
    return any(isinstance(v, (list, tuple, np.ndarray)) for v in values)


def ragged_from_lists(rows) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` from a sequence of per-row lists."""
    arrays = [np.asarray(row) for row in rows]
    offsets = wire.offsets_from_lengths(np.array([len(a) for a in arrays], dtype=np.int64))
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    return values, offsets


def _object_column(rows: list) -> np.ndarray:
    column = np.empty(len(rows), dtype=object)
    column[:] = rows
    return column
