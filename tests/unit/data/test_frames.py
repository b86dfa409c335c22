import numpy as np
import pandas as pd
import pytest
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import InputError, MissingColumnsError
from merlin_torch_serving.data import frames

SCHEMA = Schema(
    [
        ColumnSchema("session_id", dtype="int64"),
        ColumnSchema("items", dtype="int64", dims=(None, None)),
        ColumnSchema("embedding", dtype="float32", dims=(None, 2)),
    ]
)


def request(**overrides):
    data = {"session_id": [1, 2], "items": [[3, 4, 5], [6]], "embedding": [[0.5, 1.0], [2.0, 3.0]]}
    data.update(overrides)
    return data


def test_dict_of_lists_becomes_scalar_ragged_and_fixed_columns():
    table = frames.frame_to_table(request(), SCHEMA)
    assert table["items"].values.tolist() == [3, 4, 5, 6]
    assert table["items"].offsets.tolist() == [0, 3, 4]
    assert table["embedding"].values.dtype == np.float32
    assert table["embedding"].values.shape == (2, 2)


def test_frame_round_trips_through_a_table():
    frame = pd.DataFrame(request())
    back = frames.table_to_frame(frames.frame_to_table(frame, SCHEMA))
    assert back["items"].map(list).tolist() == [[3, 4, 5], [6]]
    assert back["session_id"].tolist() == [1, 2]


def test_safe_casts_are_applied_silently():
    table = frames.frame_to_table(request(session_id=np.array([1, 2], dtype=np.int32)), SCHEMA)
    assert table["session_id"].values.dtype == np.int64


def test_extra_columns_are_refused_and_missing_ones_named():
    with pytest.raises(
        InputError,
        match=(
            "input column 'extra': expected no such column \\(the inputs are 'session_id', 'items'"
        ),
    ):
        frames.frame_to_table(request(extra=[0, 0]), SCHEMA)
    data = request()
    del data["items"], data["embedding"]
    with pytest.raises(MissingColumnsError) as refused:
        frames.frame_to_table(data, SCHEMA)
    assert str(refused.value).splitlines() == [
        (
            "name the request's columns as the model's inputs, or map yours to them: "
            "columns={'<your column>': 'items', ...} (--columns YOURS=items,...)"
        ),
        (
            "missing input columns: 'items' (int64 ragged list), 'embedding' (float32 fixed list"
            " [-1, 2]); the request has 'session_id'"
        ),
    ]
    assert (refused.value.column, refused.value.missing.keys()) == ("items", {"items", "embedding"})


def test_whole_floats_are_taken_as_integer_ids():
    table = frames.frame_to_table(
        request(session_id=np.array([8382491.0, 2.0]), items=[[3.0, 4.0, 5.0], [6.0]]), SCHEMA
    )
    assert table["session_id"].values.tolist() == [8382491, 2]
    assert table["session_id"].values.dtype == np.int64
    assert table["items"].values.dtype == np.int64


@pytest.mark.parametrize("ids", [[1.5, 2.0], [float("inf"), 2.0], [2.0**64, 2.0]])
def test_floats_that_are_not_int64_values_are_refused(ids):
    with pytest.raises(InputError, match="'session_id': expected int64 scalar, got float64 values"):
        frames.frame_to_table(request(session_id=ids), SCHEMA)


def test_values_that_would_change_are_refused():
    with pytest.raises(InputError, match="'session_id': expected int64 scalar, got float64 values"):
        frames.frame_to_table(request(session_id=[1.5, 2.0]), SCHEMA)


def test_missing_values_are_named_as_such():
    with pytest.raises(InputError, match=r"'session_id'.*missing \(null\) values"):
        frames.frame_to_table(request(session_id=[1, None]), SCHEMA)


def test_fixed_length_lists_must_have_that_length():
    with pytest.raises(
        InputError,
        match="'embedding': expected float32 fixed list \\[-1, 2\\], got lists of length 1, 2",
    ):
        frames.frame_to_table(request(embedding=[[1.0], [1.0, 2.0]]), SCHEMA)


def test_a_scalar_where_a_list_is_expected_is_named():
    with pytest.raises(
        InputError, match="'items': expected int64 ragged list, got one int64 value per row"
    ):
        frames.frame_to_table(request(items=[1, 2]), SCHEMA)


def test_empty_sessions_keep_the_column_dtype():
    table = frames.frame_to_table(request(items=[[5, 6], []]), SCHEMA)
    assert table["items"].values.dtype == np.int64
    assert table["items"].offsets.tolist() == [0, 2, 2]
    all_empty = frames.frame_to_table(request(items=[[], []]), SCHEMA)
    assert all_empty["items"].values.dtype == np.int64
    assert all_empty["items"].offsets.tolist() == [0, 0, 0]


def test_a_request_without_rows_gives_empty_columns_of_every_shape():
    table = frames.frame_to_table({"session_id": [], "items": [], "embedding": []}, SCHEMA)
    assert table["session_id"].values.dtype == np.int64
    assert len(table["session_id"].values) == 0
    assert table["items"].offsets.tolist() == [0]
    assert table["embedding"].values.shape == (0, 2)


def test_bools_are_not_taken_for_ids():
    with pytest.raises(
        InputError, match="'session_id': expected int64 scalar, got bool values; send int64 values"
    ):
        frames.frame_to_table(request(session_id=[True, False]), SCHEMA)


@pytest.mark.parametrize("rows", [2, 0])
def test_a_frame_of_table_columns_equals_the_one_pandas_builds_from_a_dict(rows):
    table = frames.frame_to_table(
        pd.DataFrame(request()).head(rows)
        if rows
        else request(session_id=[], items=[], embedding=[]),
        SCHEMA,
    )
    built = frames.table_to_frame(table, {"session_id": "visit"})
    cells = frames.cells_per_row(
        {
            name: (c.values, c.offsets) if c.offsets is not None else c.values
            for name, c in table.items()
        }
    )
    expected = pd.DataFrame(cells).rename(columns={"session_id": "visit"})
    assert list(built.columns) == ["visit", "items", "embedding"]
    assert built.dtypes.tolist() == expected.dtypes.tolist()
    assert built.index.equals(expected.index)
    for name in expected.columns:
        for got, want in zip(built[name], expected[name], strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_frame_of_table_columns_owns_its_values():
    values = np.frombuffer(np.array([1, 2], dtype=np.int64).tobytes(), dtype=np.int64)  # read-only
    built = frames.columns_to_frame({"session_id": values})
    built.loc[0, "session_id"] = 7
    assert values.tolist() == [1, 2]


def test_a_nullable_integer_column_with_a_missing_value_is_named():
    frame = pd.DataFrame(request()).astype({"session_id": "Int64"})
    frame.loc[1, "session_id"] = pd.NA
    with pytest.raises(InputError, match="'session_id': expected int64 scalar, got missing"):
        frames.checked_columns(frames.frame_columns(frame), SCHEMA)
