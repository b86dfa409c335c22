"""Splitting a request into requests of at most N rows without splitting a session."""

import numpy as np
import pytest
from merlin.table import TensorTable

from merlin_torch_serving.client import chunks
from merlin_torch_serving.data import tables


def clicks(sessions):
    """A click table whose session_id column is ``sessions`` and whose position says the row."""
    return TensorTable(
        {"session_id": np.asarray(sessions), "position": np.arange(len(sessions))}, _unsafe=True
    )


def rows_of(parts):
    return [part["position"].values.tolist() for part in parts]


def test_sessions_stay_whole_in_first_appearance_order_with_their_rows_in_order():
    parts = list(chunks.split(clicks([7, 3, 7, 5, 3, 7, 5, 9]), ["session_id"], max_rows=4))
    # sessions by first appearance: 7 (rows 0, 2, 5), 3 (1, 4), 5 (3, 6), 9 (7)
    assert rows_of(parts) == [[0, 2, 5], [1, 4, 3, 6], [7]]
    assert all(tables.num_rows(part) <= 4 for part in parts)


def test_a_session_bigger_than_the_limit_travels_alone():
    assert rows_of(chunks.split(clicks([1, 2, 2, 2, 3]), ["session_id"], max_rows=2)) == [
        [0],
        [1, 2, 3],
        [4],
    ]


def test_a_request_within_the_limit_or_that_must_not_be_split_is_one_request():
    table = clicks([1, 2, 3])
    assert rows_of(chunks.split(table, ["session_id"], max_rows=3)) == [[0, 1, 2]]
    assert rows_of(chunks.split(table, None, max_rows=1)) == [[0, 1, 2]]
    assert rows_of(chunks.split(table, ["session_id"], max_rows=None)) == [[0, 1, 2]]


def test_independent_rows_are_split_anywhere():
    assert rows_of(chunks.split(clicks([1, 1, 1]), [], max_rows=2)) == [[0, 1], [2]]


def test_list_values_count_as_rows():
    sessions = TensorTable(
        {"items": (np.arange(6), np.array([0, 1, 4, 6], dtype=np.int32))}, _unsafe=True
    )
    parts = list(chunks.split(sessions, [], max_rows=3))
    assert [part["items"].offsets.tolist() for part in parts] == [[0, 1], [0, 3], [0, 2]]


@pytest.mark.parametrize("max_rows", [1, 2, 5, 30])
def test_concatenated_answers_of_the_parts_are_the_whole_table_regrouped(max_rows):
    table = clicks(np.random.default_rng(max_rows).integers(0, 6, 40))
    parts = list(chunks.split(table, ["session_id"], max_rows=max_rows))
    joined = tables.concat(parts)
    assert sorted(joined["position"].values.tolist()) == list(range(40))
    sessions = joined["session_id"].values.tolist()
    changes = [
        sessions[i] for i in range(len(sessions)) if i == 0 or sessions[i] != sessions[i - 1]
    ]
    assert changes == list(
        dict.fromkeys(table["session_id"].values.tolist())
    )  # each session contiguous, in order
