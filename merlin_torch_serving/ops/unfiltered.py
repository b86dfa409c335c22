"""Sessions a workflow's filters drop, computed as if no ``Filter`` had dropped them.

A one-click session under Transformers4Rec's ``Filter(item_id-count >= 2)`` is answered through a
placeholder row (``session_rows``); with ``TransformWorkflow(..., filtered_sessions="unfiltered")``
that row holds the session's own features (its click, the click's category) instead of empty
lists, so a route's fallback can recommend from them. The workflow runs a second time, with its
filters keeping every row, on the clicks of the dropped sessions only.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
from merlin.dag import postorder_iter_nodes
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.tables import take_rows


class KeepEveryRow:
    """A filter function that keeps every row (reads one column to know how many there are)."""

    def __init__(self, column: str):
        self.column = column

    def __call__(self, frame):
        values = frame[self.column]
        if isinstance(values, pd.Series):  # NVTabular's own Filter wants a Series
            return pd.Series(True, index=values.index)
        return np.ones(len(values), dtype=bool)


def without_filters(workflow):
    """A copy of the fitted ``workflow`` whose ``Filter`` operators keep every row."""
    from nvtabular.ops import Filter

    lifted = copy.deepcopy(workflow)
    for node in postorder_iter_nodes(lifted.output_node):
        if isinstance(node.op, Filter):
            # a scalar column, which the fast path hands over as an array (a list column would
            # send the filter to NVTabular)
            scalars = [c.name for c in node.input_schema if not c.is_list]
            node.op = Filter(f=KeepEveryRow((scalars or node.input_schema.column_names)[0]))
    return lifted


def unfiltered_rows(compiled, request: TensorTable, key: str, keys: np.ndarray) -> TensorTable:
    """The rows ``compiled`` (a workflow ``without_filters``) makes of the request's clicks of the
    sessions ``keys`` (a session some other operator drops has none)."""
    clicks = take_rows(request, np.flatnonzero(np.isin(np.asarray(request[key].values), keys)))
    return wire.from_wire(compiled.transform(wire.to_wire(clicks)), compiled.output_schema)
