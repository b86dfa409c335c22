import numpy as np
import pandas as pd
import pytest
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import InputError, MissingColumnsError
from merlin_torch_serving.data import frames, wire

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


def assert_same_frame(built: pd.DataFrame, expected: pd.DataFrame) -> None:
    """``built`` is ``expected`` column for column, dtype for dtype, cell for cell."""
    assert list(built.columns) == list(expected.columns)
    assert built.dtypes.tolist() == expected.dtypes.tolist()
    assert built.index.equals(expected.index)
    for position in range(expected.shape[1]):
        got, want = built.iloc[:, position], expected.iloc[:, position]
        for got_cell, want_cell in zip(got, want, strict=True):
            np.testing.assert_array_equal(got_cell, want_cell)


@pytest.fixture(params=[True, False], ids=["pandas internals", "public constructors"])
def internals(request, monkeypatch):
    """Both ways ``frames`` builds and reads DataFrames: through pandas' internals (pandas 1.x,
    as pinned) and through its public constructors (any other pandas)."""
    if request.param and not frames.PANDAS_INTERNALS:
        pytest.fail(f"pandas {pd.__version__} is not the pinned 1.x: its internals are not used")
    monkeypatch.setattr(frames, "PANDAS_INTERNALS", request.param)
    return request.param


@pytest.mark.parametrize("rows", [2, 0])
def test_a_frame_of_table_columns_equals_the_one_pandas_builds_from_a_dict(rows, internals):
    table = frames.frame_to_table(
        pd.DataFrame(request()).head(rows)
        if rows
        else request(session_id=[], items=[], embedding=[]),
        SCHEMA,
    )
    built = frames.table_to_frame(table, {"session_id": "visit"})
    cells = frames.cells_per_row(wire.table_columns(table))
    expected = pd.DataFrame(cells).rename(columns={"session_id": "visit"})
    assert list(built.columns) == ["visit", "items", "embedding"]
    assert_same_frame(built, expected)


def test_columns_of_other_dtypes_and_repeated_names_are_framed_as_pandas_frames_them(internals):
    columns = {
        "at": np.array(["2024-01-01T00:00:01", "2024-01-02"], dtype="datetime64[ns]"),
        "count": np.array([3, 4], dtype=np.int64),
        "half": np.array([0.5, 1.5], dtype=np.float16),
    }
    built = frames.columns_to_frame(columns, {"half": "count"})
    expected = pd.DataFrame(columns)
    expected.columns = ["at", "count", "count"]
    assert built["at"].dtype == np.dtype("datetime64[ns]")
    assert_same_frame(built, expected)


def test_a_frames_columns_are_checked_alike_whichever_way_they_are_read(internals):
    frame = pd.DataFrame(request()).astype({"session_id": "int32"})
    checked = frames.checked_columns(frames.frame_columns(frame), SCHEMA)
    assert checked["session_id"].dtype == np.int64
    assert checked["items"][0].tolist() == [3, 4, 5, 6]
    assert checked["embedding"].shape == (2, 2)


def test_a_frame_of_table_columns_owns_its_values(internals):
    values = np.frombuffer(np.array([1, 2], dtype=np.int64).tobytes(), dtype=np.int64)  # read-only
    built = frames.columns_to_frame({"session_id": values})
    built.loc[0, "session_id"] = 7
    assert values.tolist() == [1, 2]


def test_frames_of_the_same_dtypes_stay_apart_when_one_is_changed(internals):
    # frames of one sequence of dtypes share their block layout: changing one frame's columns
    # (inserting, dropping, retyping) must leave the other as it was
    def answer(first: int) -> dict:
        return {
            "session_id": np.array([first, first + 1], dtype=np.int64),
            "items": (np.arange(first, first + 4, dtype=np.int64), np.array([0, 1, 4])),
            "rank": np.array([1, 2], dtype=np.int64),
            "scores": (np.array([0.5, 0.25, 0.125, 0.0625]), np.array([0, 3, 4])),
        }

    changed, kept = frames.columns_to_frame(answer(10)), frames.columns_to_frame(answer(20))
    changed.insert(0, "first", 1.5)
    changed.drop(columns=["items"], inplace=True)
    changed["rank"] = changed["rank"].astype(np.float32)
    changed["session_id"] = ["a", "b"]
    assert list(changed.columns) == ["first", "session_id", "rank", "scores"]
    assert_same_frame(kept, pd.DataFrame(frames.cells_per_row(answer(20))))


def test_a_nullable_integer_column_with_a_missing_value_is_named(internals):
    frame = pd.DataFrame(request()).astype({"session_id": "Int64"})
    frame.loc[1, "session_id"] = pd.NA
    with pytest.raises(InputError, match="'session_id': expected int64 scalar, got missing"):
        frames.checked_columns(frames.frame_columns(frame), SCHEMA)
