"""The impressions dataset: every item an answer showed, with whether the session clicked it in
the window after: the training data of a ranking model (each shown item a row, clicked or not)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from merlin_torch_serving.evaluation.join import KEPT, Joined


def impressions(joined: Joined) -> pd.DataFrame:
    """``KEPT`` of the answer, then ``position`` (from 1), ``item_id``, ``score`` and ``clicked``,
    one row per item shown, in the log's order."""
    answers = joined.answers[KEPT]
    rows = answers.iloc[joined.shown["answer"].to_numpy()].reset_index(drop=True)
    shown = joined.shown[["position", "item_id", "score", "clicked"]].reset_index(drop=True)
    return pd.concat([rows, shown], axis=1)


def write_impressions(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """``frame`` as a parquet file, written under a hidden name and renamed: whole or absent."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    hidden = target.parent / f".{target.name}.tmp"
    frame.to_parquet(hidden, index=False)
    os.replace(hidden, target)
    return target
