"""The rows to score: read from any input, checked against the input schema, and cut into
partitions of whole sessions that do not depend on how the input was cut."""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from merlin.io import Dataset

from merlin_torch_serving import InputError, MissingColumnsError, ScoringError
from merlin_torch_serving.data import frames, tables
from merlin_torch_serving.scoring import inputs
from tests import scoring_data

SESSION = ["session_id"]


@pytest.fixture(scope="module")
def rows():
    return scoring_data.clicks(n_sessions=40)


def _partitions(frame, schema, partitions: int) -> list[pd.DataFrame]:
    placed = inputs.placed(frame, schema)
    shuffled = inputs.by_session(placed, SESSION, partitions)
    return [
        inputs.in_place_order(part, SESSION)
        for part in shuffled.to_delayed()
        for part in [part.compute(scheduler="sync")]
    ]


def test_partitions_hold_whole_sessions_in_input_order_however_the_input_was_cut(
    rows, filtered_toy_workflow
):
    schema = filtered_toy_workflow.input_schema
    one = _partitions(dd.from_pandas(rows, npartitions=1), schema, 3)
    seven = _partitions(dd.from_pandas(rows, npartitions=7), schema, 3)

    for a, b in zip(one, seven, strict=True):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    sessions = [set(part["session_id"]) for part in one]
    assert sum(map(len, sessions)) == rows["session_id"].nunique()  # no session in two parts
    for part in one:  # each session's clicks in the order the input had them
        for session_id, clicks in part.groupby("session_id", sort=False):
            expected = rows[rows["session_id"] == session_id]
            np.testing.assert_array_equal(clicks["timestamp"], expected["timestamp"])


def test_the_input_digest_depends_on_the_rows_not_their_order_or_cut(rows, filtered_toy_workflow):
    schema = filtered_toy_workflow.input_schema

    def digest(frame):
        return inputs.input_digest(inputs.placed(frame, schema), scheduler="sync")

    reference = digest(dd.from_pandas(rows, npartitions=1))
    shuffled = rows.sample(frac=1.0, random_state=1)
    assert digest(dd.from_pandas(shuffled, npartitions=5)) == reference
    changed = rows.copy()
    changed.loc[3, "timestamp"] += 1
    assert digest(dd.from_pandas(changed, npartitions=1)) != reference
    assert reference[0] == len(rows)


def test_every_kind_of_input_is_read_with_mapped_column_names(
    rows, filtered_toy_workflow, tmp_path
):
    schema = filtered_toy_workflow.input_schema
    theirs = rows.rename(columns={"session_id": "user_session"})
    folder = scoring_data.write_split(theirs, tmp_path / "clicks", files=3)
    mapping = {"user_session": "session_id"}
    for data in (
        theirs,
        dd.from_pandas(theirs, npartitions=2),
        Dataset(theirs, cpu=True),
        folder,
        str(folder / "*.parquet"),
    ):
        frame = inputs.input_frame(data, schema, mapping, rows_per_part=100)
        read = frame.compute(scheduler="sync").reset_index(drop=True)
        pd.testing.assert_frame_equal(read, rows[schema.column_names], check_dtype=False)


def test_missing_columns_and_wrong_values_are_named(rows, filtered_toy_workflow, tmp_path):
    schema = filtered_toy_workflow.input_schema
    with pytest.raises(MissingColumnsError, match="'session_id'"):
        inputs.input_frame(rows.drop(columns="session_id"), schema, None, rows_per_part=100)
    with pytest.raises(ScoringError, match="does not exist"):
        inputs.input_frame(tmp_path / "nothing", schema, None, rows_per_part=100)

    text_ids = rows.assign(item_id=rows["item_id"].astype(str) + "x")
    frame = inputs.placed(inputs.input_frame(text_ids, schema, None, rows_per_part=100), schema)
    with pytest.raises(InputError, match="input column 'item_id'"):
        frame.compute(scheduler="sync")


def test_runs_hold_a_fixed_number_of_whole_sessions_within_the_row_limit(
    rows, filtered_toy_workflow
):
    schema = filtered_toy_workflow.input_schema
    ordered = inputs.in_place_order(
        inputs.placed(dd.from_pandas(rows, npartitions=1), schema).compute(scheduler="sync"),
        SESSION,
    )
    request = frames.frame_to_table(ordered, schema)

    batches = list(inputs.session_batches(request, SESSION, 7, max_rows=None))
    sessions = [pd.unique(np.asarray(batch["session_id"].values)) for batch in batches]
    assert [len(s) for s in sessions[:-1]] == [7] * (len(batches) - 1)
    assert np.concatenate(sessions).tolist() == sorted(rows["session_id"].unique())
    assert sum(tables.num_rows(batch) for batch in batches) == len(rows)

    limited = list(inputs.session_batches(request, SESSION, 7, max_rows=12))
    assert len(limited) > len(batches)
    for batch in limited:
        keys = np.asarray(batch["session_id"].values)
        assert len(keys) <= 12 or len(set(keys)) == 1  # a longer session goes alone


def test_an_empty_or_corrupt_input_file_is_named_with_what_is_wrong(
    rows, filtered_toy_workflow, tmp_path
):
    schema = filtered_toy_workflow.input_schema
    folder = scoring_data.write_split(rows, tmp_path / "clicks", files=2)
    (folder / "clicks-2.parquet").write_bytes(b"")
    with pytest.raises(ScoringError, match=r"'.*clicks-2\.parquet' cannot be scored: it is empty"):
        inputs.input_frame(folder, schema, None, rows_per_part=100)

    (folder / "clicks-2.parquet").write_bytes(b"not parquet, but long enough for a footer")
    for data in (folder, folder / "clicks-2.parquet", str(folder / "*.parquet")):
        with pytest.raises(
            ScoringError,
            match=r"'.*clicks-2\.parquet' cannot be scored: its 41 bytes are not a readable parquet"
            r" file \(.*magic bytes",
        ):
            inputs.input_frame(data, schema, None, rows_per_part=100)

    (tmp_path / "no_parquet").mkdir()
    (tmp_path / "no_parquet" / "clicks.csv").write_text("session_id\n1\n")
    with pytest.raises(ScoringError, match=r"'.*no_parquet' holds no file ending in \.parq"):
        inputs.input_frame(tmp_path / "no_parquet", schema, None, rows_per_part=100)
