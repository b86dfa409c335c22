"""Running one operator through NVTabular itself, for the parts of a workflow that are not compiled.

The step's input batch becomes the DataFrame NVTabular's executor would hand the operator, the
operator's own ``transform`` runs on it, and the result becomes a batch again. One thing differs,
as on the fast path (see ``ordering``): NVTabular's ``Groupby`` sorts with rows whose sort keys tie
kept in the request's order; the rest of its transform is its own.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pandas as pd
from merlin.dag import ColumnSelector, DataFormats, Node
from merlin.table import TensorTable
from nvtabular.ops import Groupby

from merlin_torch_serving.data import wire
from merlin_torch_serving.fastpath.batch import (
    ARRAY_CELLS,
    LIST_CELLS,
    OFFSETS_DTYPE,
    Batch,
    Column,
)
from merlin_torch_serving.fastpath.errors import FastPathError


class NVTabularStep:
    """Calls the node's operator on a pandas DataFrame, as NVTabular's LocalExecutor does on CPU."""

    def __init__(self, node: Node, selection: ColumnSelector):
        self.op = node.op
        self.label = node.op.label
        self.selection = selection
        self.stable_sort: tuple[list[str], bool] | None = None
        if type(node.op).transform is Groupby.transform and node.op.sort_cols:
            # sorted here, stably, and the operator's own transform run without its sort
            self.stable_sort = (list(node.op.sort_cols), node.op.ascending)
            self.op = copy.copy(node.op)
            self.op.sort_cols = []
        formats = self.op.supported_formats
        self.takes_dataframe = bool(formats & DataFormats.PANDAS_DATAFRAME)
        takes_arrays = formats & (DataFormats.NUMPY_TENSOR_TABLE | DataFormats.NUMPY_DICT_ARRAY)
        if not self.takes_dataframe and not takes_arrays:
            raise FastPathError(
                f"operator {self.label!r} takes none of the CPU formats (pandas DataFrame, numpy "
                f"TensorTable or dict of arrays); it supports {formats!r}"
            )

    def __call__(self, batch: Batch) -> Batch:
        frame = to_frame(batch)
        if self.stable_sort is not None:
            columns, ascending = self.stable_sort
            frame = frame.sort_values(
                columns, ascending=ascending, kind="stable", ignore_index=True
            )
        if self.takes_dataframe:
            result = self.op.transform(self.selection, frame)
        else:
            table = TensorTable.from_df(frame)
            if not self.op.supported_formats & DataFormats.NUMPY_TENSOR_TABLE:
                table = table.to_dict()
            result = self.op.transform(self.selection, table)
        return from_transform_output(result, self.label)


def to_frame(batch: Batch) -> pd.DataFrame:
    """The DataFrame pandas-based NVTabular would hold: list columns as object columns of rows."""
    series = {}
    for name, column in batch.columns.items():
        if column.is_list:
            rows = np.split(column.values, column.list_offsets()[1:-1]) if column.num_rows else []
            cells = np.empty(column.num_rows, dtype=object)
            for position, row in enumerate(rows):
                cells[position] = row.tolist() if column.cells == LIST_CELLS else row
            series[name] = pd.Series(cells, dtype=object)
        else:
            series[name] = pd.Series(column.values)
    frame = pd.DataFrame(series)
    if not series:
        frame = pd.DataFrame(index=pd.RangeIndex(batch.num_rows))
    return frame


def from_frame(frame: pd.DataFrame) -> Batch:
    """A batch holding what the DataFrame holds, list columns recognised the way NVTabular does."""
    columns = {}
    for name in frame.columns:
        series = frame[name]
        if series.dtype == object and len(series) and pd.api.types.is_list_like(series.iloc[0]):
            columns[name] = _list_column(name, series)
        else:
            columns[name] = Column(series.to_numpy())
    return Batch(columns, len(frame))


def _list_column(name: str, series: pd.Series) -> Column:
    try:
        lengths = series.map(len).to_numpy(dtype=np.int64)
    except TypeError:
        raise FastPathError(
            f"list column {name!r} has rows that are not lists (e.g. None); the fast path holds "
            "list columns as values and offsets, which cannot represent a missing row"
        ) from None
    offsets = wire.offsets_from_lengths(lengths, OFFSETS_DTYPE)
    # Flatten the way NVTabular does, so that the values get the dtype pandas infers.
    values = pd.Series(list(itertools.chain.from_iterable(series)), dtype=None).to_numpy()
    if len(values) == 0:
        values = np.array([], dtype=np.float64)
    cells = LIST_CELLS if isinstance(series.iloc[0], list) else ARRAY_CELLS
    return Column(values, offsets, cells)


def from_transform_output(result, label: str) -> Batch:
    if isinstance(result, pd.DataFrame):
        return from_frame(result)
    if isinstance(result, TensorTable):
        result = {name: (column.values, column.offsets) for name, column in result.items()}
    if isinstance(result, dict):
        columns = {}
        for name, value in result.items():
            values, offsets = value if isinstance(value, tuple) else (value, None)
            if offsets is not None:
                columns[name] = Column(
                    np.asarray(values), np.asarray(offsets, dtype=np.int64), ARRAY_CELLS
                )
            else:
                columns[name] = Column(np.asarray(values))
        return Batch.of(columns)
    raise FastPathError(
        f"operator {label!r} returned a {type(result).__name__} from transform; expected a pandas "
        "DataFrame, a TensorTable or a dict of arrays"
    )
