"""UnrollCandidates: one row per candidate, ragged sessions of different lengths included, the
session's columns repeated on each of its rows."""

import numpy as np
import pytest
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, SchemaError
from merlin_torch_serving.multistage import UnrollCandidates

SCHEMA = Schema(
    [
        ColumnSchema("candidate_ids", dtype="int64", dims=(None, None)),
        ColumnSchema("candidate_scores", dtype="float32", dims=(None, None)),
        ColumnSchema("session_id", dtype="int64", dims=(None,)),
        ColumnSchema("clicks", dtype="int64", dims=(None, None)),
    ]
)


def sessions():
    offsets = np.array([0, 3, 3, 4], dtype=np.int32)
    return TensorTable(
        {
            "candidate_ids": (np.array([5, 6, 7, 8], dtype=np.int64), offsets),
            "candidate_scores": (np.array([1, 2, 3, 4], dtype=np.float32), offsets),
            "session_id": np.array([10, 11, 12], dtype=np.int64),
            "clicks": (np.array([1, 2, 3], dtype=np.int64), np.array([0, 1, 1, 3], np.int32)),
        }
    )


def test_each_candidate_becomes_a_row_with_its_sessions_columns():
    graph = ["candidate_ids", "candidate_scores"] >> UnrollCandidates(["session_id", "clicks"])

    rows = Ensemble(graph, SCHEMA).run(sessions())

    np.testing.assert_array_equal(rows["candidate_ids"].values, [5, 6, 7, 8])
    np.testing.assert_array_equal(rows["session_id"].values, [10, 10, 10, 12])
    np.testing.assert_array_equal(rows["clicks"].values, [1, 1, 1, 2, 3])
    np.testing.assert_array_equal(rows["clicks"].offsets, [0, 1, 2, 3, 5])


def test_a_session_column_renamed_onto_a_candidate_column_is_refused():
    schema = SCHEMA + Schema([ColumnSchema("ids", dtype="int64", dims=(None,))])
    with pytest.raises(SchemaError, match="session columns named apart"):
        Ensemble(["candidate_ids"] >> UnrollCandidates(["ids"], prefix="candidate_"), schema)


def test_a_scalar_column_cannot_be_unrolled():
    with pytest.raises(SchemaError, match="a ragged list"):
        Ensemble(["candidate_ids", "session_id"] >> UnrollCandidates(), SCHEMA)
