"""FilterCandidates: per session, the index's -1 padding, the session's own items and blocked ids
out, the rest in order with their scores; the drops counted."""

import numpy as np
import pytest
from merlin.dag import ColumnSelector
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, SchemaError
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.multistage import FilterCandidates

RETRIEVED = Schema(
    [
        ColumnSchema("item_ids", dtype="int64", dims=(None, 4)),
        ColumnSchema("item_scores", dtype="float32", dims=(None, 4)),
        ColumnSchema("seen", dtype="int64", dims=(None, None)),
    ]
)


def retrieved():
    return TensorTable(
        {
            "item_ids": np.array([[5, 7, -1, -1], [9, 5, 8, 3]], dtype=np.int64),
            "item_scores": np.array([[4, 3, -np.inf, -np.inf], [9, 8, 7, 6]], dtype=np.float32),
            "seen": (np.array([7, 8], dtype=np.int64), np.array([0, 0, 2], dtype=np.int32)),
        }
    )


def run(op):
    graph = ["item_ids", "item_scores"] >> op
    return Ensemble(graph, RETRIEVED).run(retrieved())


def test_padding_the_sessions_own_items_and_blocked_ids_are_dropped_per_session():
    with metrics.collecting() as counted:
        answer = run(FilterCandidates(exclude="seen", block_ids=[3]))

    ids, scores = answer["candidate_ids"], answer["candidate_scores"]
    np.testing.assert_array_equal(ids.values, [5, 7, 9, 5])
    np.testing.assert_array_equal(ids.offsets, [0, 2, 4])
    np.testing.assert_array_equal(scores.values, np.array([4, 3, 9, 8], dtype=np.float32))
    assert counted.totals[(metrics.INVALID_CANDIDATES, ())] == 2
    assert counted.totals[(metrics.EXCLUDED_CANDIDATES, ())] == 2  # 8 seen by row 1, 3 blocked


def test_a_session_left_without_candidates_gets_an_empty_list():
    answer = run(FilterCandidates(block_ids=[5, 7, 9, 8, 3]))

    np.testing.assert_array_equal(answer["candidate_ids"].offsets, [0, 0, 0])


def test_the_seen_items_of_one_session_do_not_drop_another_sessions_candidates():
    op = FilterCandidates(exclude="seen")
    table = TensorTable(
        {
            "item_ids": np.array([[8, 1, 2, 3]], dtype=np.int64).repeat(2, axis=0),
            "seen": (np.array([8], dtype=np.int64), np.array([0, 1, 1], dtype=np.int32)),
        }
    )
    out = op.transform(ColumnSelector(["item_ids", "seen"]), table)

    np.testing.assert_array_equal(out["candidate_ids"].values, [1, 2, 3, 8, 1, 2, 3])


def test_two_int_list_columns_without_naming_the_candidates_is_a_schema_error():
    schema = Schema(
        [
            ColumnSchema("a", dtype="int64", dims=(None, 4)),
            ColumnSchema("b", dtype="int64", dims=(None, 4)),
        ]
    )
    with pytest.raises(SchemaError, match="exactly one int list column of candidates"):
        Ensemble(["a", "b"] >> FilterCandidates(), schema)


def test_it_reads_back_what_it_exported(tmp_path):
    op = FilterCandidates(exclude="seen", block_ids=[3, 1])

    loaded = FilterCandidates.load(op.config(), str(tmp_path))

    assert loaded.config() == op.config()
    assert loaded.block_ids == [1, 3]
