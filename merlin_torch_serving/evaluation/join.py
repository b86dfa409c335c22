"""The answer log joined with the clicks that came after each answer: the session's clicks within
``window`` after it. Per answer, where the next of them was in the list shown and how many of them
the first k items held; per item shown, whether it was clicked (the impressions).

An item counts as shown at its position in the answer's list unless its score is not finite (the
padding of a list with fewer candidates than places, the blank answer of a session no branch
answered). An answer with no click in its window has no next click to be judged by: it counts as
answered, not as a miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from merlin_torch_serving.exceptions import AnswerLogError

#: the answer log's columns the join keeps, one row per answer
KEPT = ["request_id", "session_id", "answered_at", "branch", "variant"]


@dataclass(frozen=True)
class Joined:
    """``answers``: one row per logged answer (``KEPT``, then ``clicked`` whether a click came in
    its window, ``next_rank`` the 1-based position of the next click's item in the list, 0 when
    it was not shown, ``later_items`` the distinct items clicked in the window, and ``hits@k``
    how many of those the first k items held). ``shown``: one row per item shown (``answer``, the
    row of ``answers``; ``position``; ``item_id``; ``score``; ``clicked``). ``items``: the
    distinct items shown or clicked."""

    answers: pd.DataFrame
    shown: pd.DataFrame
    ks: tuple[int, ...]
    window: pd.Timedelta
    items: int


def join(
    log: pd.DataFrame, clicks: pd.DataFrame, window: pd.Timedelta, ks: Sequence[int]
) -> Joined:
    """Join ``log`` (``read_answers``) with ``clicks`` (``read_clicks``)."""
    if log.empty:
        raise AnswerLogError("the answer log holds no answers; serve through the logged graph")
    answers = log[KEPT].reset_index(drop=True)
    shown = _shown(log)
    items, clicked_items = _same_kind(shown["item_id"], clicks["item_id"])
    shown["item_id"] = items
    clicks = clicks.assign(item_id=clicked_items)
    later = _later_clicks(answers, clicks, window)
    distinct = later.drop_duplicates(["answer", "item_id"])[["answer", "item_id"]]
    first = later.drop_duplicates("answer")[["answer", "item_id"]]

    answers["clicked"] = np.isin(answers.index, first["answer"])
    ranks = shown.merge(first, on=["answer", "item_id"]).groupby("answer")["position"].min()
    answers["next_rank"] = ranks.reindex(answers.index, fill_value=0).astype(np.int64)
    answers["later_items"] = (
        distinct.groupby("answer").size().reindex(answers.index, fill_value=0).astype(np.int64)
    )
    hit = shown.merge(distinct.assign(clicked=True), on=["answer", "item_id"], how="left")
    shown["clicked"] = hit["clicked"].fillna(False).astype(bool).to_numpy()
    clicked_positions = shown.loc[shown["clicked"], ["answer", "position"]]
    for k in ks:
        within = clicked_positions[clicked_positions["position"] <= k]
        counts = within.groupby("answer").size().reindex(answers.index, fill_value=0)
        answers[f"hits@{k}"] = counts.astype(np.int64)
    known = len(set(shown["item_id"].tolist()) | set(clicks["item_id"].tolist()))
    return Joined(answers, shown, tuple(ks), window, known)


def _shown(log: pd.DataFrame) -> pd.DataFrame:
    """One row per item shown: the answer's row, the position (from 1), the item and its score."""
    lengths = log["item_ids"].map(len).to_numpy()
    answer = np.repeat(np.arange(len(log)), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    items = np.concatenate([np.asarray(ids) for ids in log["item_ids"]]) if len(answer) else []
    scores = np.concatenate([np.asarray(s) for s in log["scores"]]) if len(answer) else []
    shown = pd.DataFrame(
        {
            "answer": answer,
            "position": np.arange(len(answer)) - starts + 1,
            "item_id": items,
            "score": scores,
        }
    )
    return shown[np.isfinite(shown["score"].to_numpy(dtype=np.float64))].reset_index(drop=True)


def _later_clicks(answers: pd.DataFrame, clicks: pd.DataFrame, window: pd.Timedelta):
    """Each answer's clicks within ``window`` after it, in time order: ``answer``, ``item_id``."""
    sessions = answers[["session_id", "answered_at"]].assign(answer=answers.index)
    if sessions["session_id"].dtype != clicks["session_id"].dtype:
        sessions["session_id"], clicks = (
            sessions["session_id"].astype(str),
            clicks.assign(session_id=clicks["session_id"].astype(str)),
        )
    pairs = sessions.merge(clicks, on="session_id")
    after = pairs["clicked_at"] > pairs["answered_at"]
    within = pairs["clicked_at"] <= pairs["answered_at"] + window
    later = pairs[after & within]
    return later.sort_values(["answer", "clicked_at"], kind="stable")[["answer", "item_id"]]


def _same_kind(shown: pd.Series, clicked: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Item ids of both sides as one type: text when either is text."""
    if shown.dtype == object or clicked.dtype == object:
        return shown.astype(str), clicked.astype(str)
    return shown.astype(np.int64), clicked.astype(np.int64)
