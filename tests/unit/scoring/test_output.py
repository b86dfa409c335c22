"""The output folder of a scoring run: answers written as the client returns them, parts written
whole or not at all, kept only for a rerun of the same run, another run's answers refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import ScoringError
from merlin_torch_serving.data import frames
from merlin_torch_serving.scoring import answers, output

RECORD = output.RunRecord(
    ensemble="reco",
    repository="/models",
    export_digest="e" * 64,
    input_rows=10,
    input_digest="a-0000000000000001",
    partitions=3,
    session_columns=["session_id"],
)

SCHEMA = Schema(
    [
        ColumnSchema("session_id", dtype="int64", dims=(None,)),
        ColumnSchema("item_ids", dtype="int64", dims=(None, 3)),
        ColumnSchema("history", dtype="int32", dims=(None, None)),
        ColumnSchema("title", dtype="str", dims=(None,)),
        ColumnSchema("filtered_out", dtype="bool", dims=(None,)),
    ]
)


def _answer_table() -> TensorTable:
    return TensorTable(
        {
            "session_id": np.array([5, 9], dtype=np.int64),
            "item_ids": np.array([[1, 2, 3], [-1, -1, -1]], dtype=np.int64),
            "history": (np.array([4, 5, 6], dtype=np.int32), np.array([0, 3, 3], dtype=np.int32)),
            "title": np.array(["a", ""], dtype=object),
            "filtered_out": np.array([False, True]),
        },
        _unsafe=True,
    )


def test_a_part_reads_back_as_the_client_returns_the_answer(tmp_path):
    table = _answer_table()

    output.write_part(tmp_path, 0, answers.arrow_answer(table, SCHEMA), {"run": RECORD.key})

    read = pd.read_parquet(tmp_path / output.part_name(0))
    expected = frames.table_to_frame(table)
    assert list(read.columns) == list(expected.columns)
    for name in expected.columns:
        for got, want in zip(read[name], expected[name], strict=True):
            np.testing.assert_array_equal(got, want)
            assert np.asarray(got).dtype == np.asarray(want).dtype, name
    assert list(tmp_path.iterdir()) == [tmp_path / output.part_name(0)]  # no temporary left


def test_renamed_answer_columns_and_an_empty_answer_keep_the_schema(tmp_path):
    renamed = {"session_id": "user_session"}
    empty = answers.empty_answer(SCHEMA, renamed)
    full = answers.arrow_answer(_answer_table(), SCHEMA, renamed)
    assert empty.schema == full.schema
    assert empty.column_names[0] == "user_session"


def test_only_parts_of_the_same_run_count_as_done(tmp_path):
    output.start_run(tmp_path, RECORD, overwrite=False)
    table = answers.arrow_answer(_answer_table(), SCHEMA)
    output.write_part(tmp_path, 0, table, {"run": RECORD.key, "sessions": 2})
    output.write_part(tmp_path, 2, table, {"run": "another run", "sessions": 2})
    (tmp_path / output.part_name(1)).write_bytes(b"half a parquet file")

    assert set(output.done_parts(tmp_path, RECORD)) == {0}
    assert output.done_parts(tmp_path, RECORD)[0]["sessions"] == 2


def test_a_rerun_keeps_its_parts_and_another_run_is_refused_unless_overwritten(tmp_path):
    output.start_run(tmp_path, RECORD, overwrite=False)
    output.write_part(
        tmp_path, 1, answers.arrow_answer(_answer_table(), SCHEMA), {"run": RECORD.key}
    )
    (tmp_path / "part-00001.parquet.0123.writing").write_bytes(b"left by a killed worker")

    output.start_run(tmp_path, RECORD, overwrite=False)
    assert set(output.done_parts(tmp_path, RECORD)) == {1}
    assert not list(tmp_path.glob("*.writing"))

    other_input = dataclasses.replace(RECORD, input_rows=11, input_digest="b-02")
    with pytest.raises(ScoringError, match=r"pass overwrite=True .*\(another input: 10 rows"):
        output.start_run(tmp_path, other_input, overwrite=False)
    output.start_run(tmp_path, other_input, overwrite=True)
    assert not list(tmp_path.glob("part-*"))
    assert output.read_record(tmp_path) == other_input


def test_the_same_export_from_another_path_is_the_same_run():
    assert dataclasses.replace(RECORD, repository="/elsewhere").key == RECORD.key
    assert dataclasses.replace(RECORD, partitions=4).key != RECORD.key


def test_part_files_no_run_recorded_are_refused(tmp_path):
    pq.write_table(answers.empty_answer(SCHEMA), tmp_path / output.part_name(0))
    with pytest.raises(ScoringError, match="holds 1 part files that no scoring run recorded"):
        output.start_run(tmp_path, RECORD, overwrite=False)


def test_a_folder_holding_files_scoring_does_not_write_is_refused_naming_them_even_to_overwrite(
    tmp_path,
):
    output.start_run(tmp_path, RECORD, overwrite=False)
    output.write_part(
        tmp_path, 0, answers.arrow_answer(_answer_table(), SCHEMA), {"run": RECORD.key}
    )
    pd.DataFrame({"other": range(5)}).to_parquet(tmp_path / "other.parquet")
    (tmp_path / "notes").mkdir()
    (tmp_path / ".hidden").write_text("readers skip hidden files")

    for overwrite in (False, True):
        with pytest.raises(
            ScoringError,
            match=r"write into another folder .* holds 2 entries scoring does not write, which"
            r" readers of the answers .* would read with them: 'notes/', 'other.parquet'",
        ):
            output.start_run(tmp_path, RECORD, overwrite=overwrite)
    assert (tmp_path / "other.parquet").is_file()  # nothing of the user's removed
    (tmp_path / "other.parquet").unlink()
    (tmp_path / "notes").rmdir()
    output.start_run(tmp_path, RECORD, overwrite=False)  # the run's own files: a rerun resumes
    assert set(output.done_parts(tmp_path, RECORD)) == {0}
