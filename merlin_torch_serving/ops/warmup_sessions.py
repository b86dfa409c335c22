"""Raw-row requests that a workflow's filters let through, to warm served models up with.

A one-click sample is what a schema alone suggests, and ``Filter(item_id-count >= 2)`` drops it:
the served models would then warm up on a filtered session only. These candidates are sessions of
several lengths whose categorical values come from the fitted vocabularies (so value filters on
known items pass) and, failing that, whose other numbers are constants of several magnitudes.
"""

from __future__ import annotations

import numpy as np
from merlin.dag import postorder_iter_nodes
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.samples import sample_values
from merlin_torch_serving.data.vocabulary import read_labels

SESSION_LENGTHS = (5, 2, 20, 60, 1)
CONSTANTS = (1, 1000, -1)


def session_requests(workflow, session_key: str | None) -> list[TensorTable]:
    """Candidates, best first: sampled values at each length, then constant numbers."""
    schema = workflow.input_schema
    known = _known_values(workflow)
    candidates = []
    for constant in (None, *CONSTANTS):
        for length in SESSION_LENGTHS:
            candidates.append(_session(schema, session_key, known, length, constant))
    return candidates


def _session(
    schema: Schema, session_key: str | None, known: dict, length: int, constant
) -> TensorTable:
    columns: dict[str, wire.TableColumn] = {}
    for position, column in enumerate(schema):
        dtype = wire.column_numpy_dtype(column)
        if wire.is_ragged(column):
            values = sample_values(column, 2 * length, seed=position)
            columns[column.name] = (values, wire.offsets_from_lengths(np.full(length, 2)))
            continue
        if column.name == session_key:
            values = np.repeat(sample_values(column, 1, seed=position), length)
        elif column.name in known and len(known[column.name]):
            values = np.resize(known[column.name], length)
            values = values if dtype == np.dtype(object) else values.astype(dtype)
        elif constant is not None and dtype.kind in "iuf":
            values = np.full(length, constant, dtype=dtype)
        else:
            # increasing values, so that time columns order the session's clicks
            values = np.sort(sample_values(column, length, seed=position))
        columns[column.name] = values
    return TensorTable(columns, _unsafe=True)


def _known_values(workflow) -> dict[str, np.ndarray]:
    """Each categorified input column's vocabulary values (most frequent first), nulls left out."""
    from nvtabular.ops import Categorify

    known = {}
    for node in postorder_iter_nodes(workflow.output_node):
        if isinstance(node.op, Categorify):
            for column in node.op.categories:
                values, _ = read_labels(node.op, column)
                known[column] = values[~_is_null(values)][:64]
    return known


def _is_null(values: np.ndarray) -> np.ndarray:
    import pandas as pd

    return np.asarray(pd.isna(values), dtype=bool)
