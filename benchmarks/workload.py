"""What every system is asked to do: the session-based example's workflow and model, and the
requests (raw click rows of held-out sessions) sent to all of them in the same order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from examples.session_based import data, features, model

MAX_SEQUENCE_LENGTH = 20
TOP_K = 10
# Categorify's padding, null and out-of-vocabulary ids
RESERVED_IDS = (0, 1, 2)
# Each setting cycles through this many different requests, so no answer is the same twice in a
# row and every system sees the same sequence.
REQUESTS_PER_SETTING = 16


@dataclass
class Workload:
    """The fitted workflow, the trained (eager) Transformers4Rec model and the request frames."""

    workflow: object
    workflow_dir: Path
    session_model: object
    #: sessions per request -> request frames (raw rows of that many held-out sessions)
    requests: dict[int, list[pd.DataFrame]]
    training_seconds: float
    epochs: int
    n_train_sessions: int


def build_workload(
    directory: Path, *, session_counts: tuple[int, ...], epochs: int = 1, progress: bool = True
) -> Workload:
    """Generate clicks, fit the workflow, train the model briefly and cut the requests.

    Speed is what is measured, not accuracy, so one epoch is enough: the model has the real
    architecture and catalog size whether or not it has converged.
    """
    clicks = data.generate_interactions()
    train, held_out = data.split_by_time(clicks)
    workflow_dir = directory / "workflow"
    workflow = features.fit_workflow(train, workflow_dir, max_sequence_length=MAX_SEQUENCE_LENGTH)
    session_model = model.build_model(
        workflow.output_schema, max_sequence_length=MAX_SEQUENCE_LENGTH
    )
    started = time.perf_counter()
    model.train(
        session_model, features.transform(workflow, train), epochs=epochs, progress=progress
    )
    training_seconds = time.perf_counter() - started
    requests = {n: request_frames(held_out, n, REQUESTS_PER_SETTING) for n in session_counts}
    return Workload(
        workflow=workflow,
        workflow_dir=workflow_dir,
        session_model=session_model,
        requests=requests,
        training_seconds=training_seconds,
        epochs=epochs,
        n_train_sessions=int(train["session_id"].nunique()),
    )


def request_frames(
    interactions: pd.DataFrame, sessions_per_request: int, count: int
) -> list[pd.DataFrame]:
    """``count`` frames of the raw rows of ``sessions_per_request`` consecutive sessions each,
    rows in their original order (as an app would send a session's clicks). When there are too
    few sessions for all frames to differ, frames wrap around and share sessions."""
    session_ids = interactions["session_id"].drop_duplicates().to_numpy()
    if len(session_ids) < sessions_per_request:
        raise ValueError(
            f"{sessions_per_request} sessions per request need at least that many held-out "
            f"sessions, got {len(session_ids)}"
        )
    frames = []
    for index in range(count):
        start = (index * sessions_per_request) % (len(session_ids) - sessions_per_request + 1)
        chosen = session_ids[start : start + sessions_per_request]
        frame = interactions[interactions["session_id"].isin(chosen)].reset_index(drop=True)
        frames.append(frame[list(data.INTERACTION_COLUMNS)])
    return frames
