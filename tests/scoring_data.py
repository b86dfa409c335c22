"""Rows to score and answers to compare, for the batch-scoring tests: raw clicks with unknown
items and one-click sessions (which a workflow filtering on ``item_id-count >= 2`` drops), written
as parquet files that split sessions between them, and answers compared exactly, row by row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tests import toy_session

UNKNOWN_ITEM_ID = 999_999  # never seen when the toy workflow was fitted


def clicks(n_sessions: int = 120, seed: int = 5) -> pd.DataFrame:
    """Toy clicks in shuffled order (a session's clicks are not together), one in six replaced by
    an unknown item, and every click of ``all_unknown_session`` too; sessions of one click among
    them."""
    rows = toy_session.interactions(n_sessions, seed=seed, first_session=20_000)
    rows.loc[rows.index % 6 == 0, "item_id"] = UNKNOWN_ITEM_ID
    rows.loc[rows["session_id"] == all_unknown_session(rows), "item_id"] = UNKNOWN_ITEM_ID
    if (rows.groupby("session_id").size() == 1).sum() == 0:
        raise ValueError("no one-click session among the clicks; use another seed")
    return rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def all_unknown_session(rows: pd.DataFrame) -> int:
    """The first session of several clicks: ``clicks`` gives it only unknown items."""
    lengths = rows.groupby("session_id").size()
    return int(lengths.index[lengths > 2][0])


def write_split(rows: pd.DataFrame, folder: Path, files: int) -> Path:
    """``rows`` cut into ``files`` parquet files in order, so that most sessions span several."""
    folder.mkdir(parents=True)
    for index, part in enumerate(np.array_split(np.arange(len(rows)), files)):
        rows.iloc[part].to_parquet(folder / f"clicks-{index}.parquet", index=False)
    return folder


def read_answers(folder: Path, key: str = "session_id") -> pd.DataFrame:
    """Every part file of a scoring output, one frame, in session order."""
    parts = [pd.read_parquet(path) for path in sorted(Path(folder).glob("part-*.parquet"))]
    return in_session_order(pd.concat(parts, ignore_index=True), key)


def in_session_order(answer: pd.DataFrame, key: str = "session_id") -> pd.DataFrame:
    return answer.sort_values(key, kind="stable").reset_index(drop=True)


def assert_same_answers(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Same columns in the same order with the same dtypes, and every cell equal bit for bit (list
    cells element by element, NaN equal to NaN)."""
    assert list(got.columns) == list(expected.columns)
    assert got.dtypes.to_dict() == expected.dtypes.to_dict()
    assert len(got) == len(expected)
    for name in expected.columns:
        for row, (a, b) in enumerate(zip(got[name], expected[name], strict=True)):
            np.testing.assert_array_equal(a, b, err_msg=f"column {name!r}, row {row}")
