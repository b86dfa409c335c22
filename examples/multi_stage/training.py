"""Impressions for the ranker and the offline comparison of orders, from the synthetic clicks (or
from what a served graph showed: ``logged_impressions`` reads an answer log's impressions).

A session's last click is what it wants next: the request is every click before it, the candidates
are what retrieval finds for that request, and the candidate that is the last click is the one
impression clicked. The ranker learns on sessions the session model never saw; both orders are
judged on later, held-out sessions by recall@10 (the last click among the first ten) and NDCG@10
(counted 1 / log2(1 + its rank) there).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from merlin.table import TensorTable

from examples.multi_stage import ranker as ranking
from merlin_torch_serving import Ensemble
from merlin_torch_serving.data import frames

#: sessions per in-process call while making impressions or judging orders
SESSIONS_PER_CALL = 200


def prefixes_and_targets(clicks: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """The clicks of each session of two or more before its last one, and that last item (indexed
    by session id)."""
    ordered = clicks.sort_values(["session_id", "timestamp"], kind="stable")
    last = ordered.groupby("session_id").tail(1)
    sizes = ordered.groupby("session_id").size()
    kept = sizes.index[sizes >= 2]
    prefixes = ordered.drop(last.index)
    prefixes = prefixes[prefixes["session_id"].isin(kept)].reset_index(drop=True)
    targets = last.set_index("session_id")["item_id"].loc[kept]
    return prefixes, targets


def in_chunks(ensemble: Ensemble, requests: pd.DataFrame):
    """``ensemble.run`` over the requests' sessions, SESSIONS_PER_CALL at a time: each answer."""
    sessions = requests["session_id"].unique()
    for start in range(0, len(sessions), SESSIONS_PER_CALL):
        chunk = requests[requests["session_id"].isin(sessions[start : start + SESSIONS_PER_CALL])]
        yield ensemble.run(frames.frame_to_table(chunk, ensemble.input_schema))


def impressions(
    rows_ensemble: Ensemble, prefixes: pd.DataFrame, targets: pd.Series, negatives: int, seed: int
) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """The ranker's padded inputs and labels: per session its clicked candidate (when retrieval
    found it) and up to ``negatives`` others drawn at random."""
    rng = np.random.default_rng(seed)
    parts, labels = [], []
    for rows in in_chunks(rows_ensemble, prefixes):
        sessions = np.asarray(rows["session_id"].values)
        clicked = np.asarray(rows["candidate_ids"].values) == targets.reindex(sessions).to_numpy()
        keep = clicked.copy()
        for session in np.unique(sessions):
            others = np.flatnonzero((sessions == session) & ~clicked)
            keep[rng.choice(others, min(negatives, len(others)), replace=False)] = True
        parts.append(ranker_inputs(rows, np.flatnonzero(keep)))
        labels.append(clicked[keep].astype(np.float32))
    inputs = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
    return inputs, np.concatenate(labels)


def logged_impressions(
    rows_ensemble: Ensemble, impressions: pd.DataFrame, clicks: pd.DataFrame, clicked_at: str
) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """The ranker's padded inputs and labels from served answers: the impressions dataset of an
    answer log's read-out (every item an answer showed, clicked or not) and the clicks it was
    read out with (``clicked_at``: their time, seconds since the epoch). Each answer's request is
    rebuilt from its session's clicks up to it, the pipeline computes the rows of its candidates,
    and the rows of the items it showed are kept, labelled clicked or not (an item shown that
    retrieval does not find for those clicks is left out)."""
    answers = impressions.drop_duplicates(["request_id", "session_id", "answered_at"])
    answers = answers.sort_values("answered_at", kind="stable")
    # the n-th answers of all sessions: each session once, so each is one request of sessions
    turns = answers.groupby("session_id").cumcount().to_numpy()
    made_at = pd.to_datetime(clicks[clicked_at], unit="s", utc=True)
    clicks = clicks.assign(_made_at=made_at)
    columns = list(rows_ensemble.input_schema.column_names)
    shown = impressions.set_index(["session_id", "answered_at", "item_id"])["clicked"]
    parts, labels = [], []
    for turn in np.unique(turns):
        asked = answers.loc[turns == turn, ["session_id", "answered_at"]]
        prefixes = clicks.merge(asked, on="session_id")
        prefixes = prefixes[prefixes["_made_at"] <= prefixes["answered_at"]]
        answered_at = asked.set_index("session_id")["answered_at"]
        for rows in in_chunks(rows_ensemble, prefixes[columns]):
            sessions = np.asarray(rows["session_id"].values)
            keys = zip(
                sessions,
                answered_at.reindex(sessions),
                np.asarray(rows["candidate_ids"].values),
                strict=True,
            )
            found = shown.reindex(list(keys))
            keep = np.flatnonzero(found.notna().to_numpy())
            parts.append(ranker_inputs(rows, keep))
            labels.append(found.to_numpy()[keep].astype(np.float32))
    inputs = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
    return inputs, np.concatenate(labels)


def ranker_inputs(rows: TensorTable, keep: np.ndarray) -> dict[str, torch.Tensor]:
    """The ranker's inputs of the kept rows, lists padded as ``PredictPytorch`` pads them: the
    last values kept, zeros on the right."""
    inputs = {}
    for column in ranking.input_schema():
        data = rows[column.name]
        if data.offsets is None:
            inputs[column.name] = torch.from_numpy(np.asarray(data.values)[keep])
            continue
        length = int(column.shape.dims[1].max)
        offsets = np.asarray(data.offsets).astype(np.int64)
        padded = np.zeros((len(keep), length), dtype=np.asarray(data.values).dtype)
        for row, source in enumerate(keep):
            values = np.asarray(data.values)[offsets[source] : offsets[source + 1]][-length:]
            padded[row, : len(values)] = values
        inputs[column.name] = torch.from_numpy(padded)
    return inputs


def judged(ranked: dict[int, np.ndarray], targets: pd.Series, k: int = 10) -> dict[str, float]:
    """recall@k and NDCG@k of each session's ranked ids against its target (one relevant item)."""
    recall, ndcg = [], []
    for session, target in targets.items():
        top = np.asarray(ranked.get(int(session), []))[:k]
        hit = np.flatnonzero(top == target)
        recall.append(float(len(hit) > 0))
        ndcg.append(1.0 / np.log2(hit[0] + 2) if len(hit) else 0.0)
    return {f"recall@{k}": float(np.mean(recall)), f"NDCG@{k}": float(np.mean(ndcg))}


def retrieval_order(candidates_ensemble: Ensemble, prefixes: pd.DataFrame) -> dict[int, np.ndarray]:
    """Each session's filtered candidates in retrieval order."""
    ranked = {}
    for answer in in_chunks(candidates_ensemble, prefixes):
        ids = answer["candidate_ids"]
        offsets = np.asarray(ids.offsets)
        for row, session in enumerate(np.asarray(answer["session_id"].values)):
            ranked[int(session)] = np.asarray(ids.values)[offsets[row] : offsets[row + 1]]
    return ranked


def ranked_order(ensemble: Ensemble, prefixes: pd.DataFrame) -> dict[int, np.ndarray]:
    """Each session's answer of the whole pipeline (its first ``item_count`` ids)."""
    ranked = {}
    for answer in in_chunks(ensemble, prefixes):
        ids = np.asarray(answer["item_ids"].values)
        counts = np.asarray(answer["item_count"].values)
        for row, session in enumerate(np.asarray(answer["session_id"].values)):
            ranked[int(session)] = ids[row, : counts[row]]
    return ranked
