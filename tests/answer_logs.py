"""Logged graphs for the answer log's tests, answers made up for its writer, a small real
filesystem to fill up, and comparing a log with the answers it should hold."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import Ensemble, LogAnswers, TransformWorkflow
from merlin_torch_serving.answer_log import records
from merlin_torch_serving.routing import Experiment
from tests import routed_graphs, toy_session

SESSION = "session_id"


def rows(n_sessions: int, seed: int, first: int = 1000) -> pd.DataFrame:
    """Raw clicks of ``n_sessions`` toy sessions, numbered from ``first``."""
    return toy_session.interactions(n_sessions, seed=seed, first_session=first)


class Columns:
    """A list column as ``LogAnswers`` receives it."""

    def __init__(self, values, offsets=None):
        self.values, self.offsets = values, offsets


def made_up_answers(first_session: int, sessions: int = 4, k: int = 3) -> records.Answers:
    """What ``LogAnswers`` hands its writer for ``sessions`` sessions numbered from
    ``first_session``, ``k`` items each."""
    ids = np.arange(sessions * k, dtype=np.int64).reshape(sessions, k) + first_session
    return records.taken(
        None,
        None,
        None,
        np.arange(first_session, first_session + sessions),
        Columns(ids),
        Columns(ids.astype(np.float32) / 7),
    )


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def logged_routed(workflow, model, destination, *, inline=("popular",), **options):
    """The routed toy graph (tests/routed_graphs.py) with every answer logged to ``destination``:
    (ensemble, its LogAnswers)."""
    features = workflow.input_schema.column_names >> TransformWorkflow(
        workflow, filtered_sessions="unfiltered"
    )
    log = LogAnswers(destination, session_ids=features[SESSION], **options)
    graph = routed_graphs.routed(workflow, model, inline=inline, features=features) >> log
    return Ensemble(graph, workflow.input_schema), log


@contextlib.contextmanager
def small_filesystem(path: Path, size: str = "1m"):
    """A tmpfs of ``size`` mounted at ``path`` (a real filesystem that fills up), unmounted after.
    Mounting needs root, as the tests and CI run."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"could not mount a {size} tmpfs at {str(path)!r} to fill up (it needs root):"
            f" {mounted.stderr.strip()}",
            pytrace=False,
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> Path:
    """A file that takes every free byte of ``folder``'s filesystem."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as file:
        for size in (65536, 1):  # then the last bytes, one at a time
            try:
                while file.write(b"\0" * size):
                    pass
            except OSError:
                pass
    return filler


def answered_sessions(answer: pd.DataFrame, request_id: str) -> pd.DataFrame:
    """What the log should hold of ``answer`` (one row per session) under ``request_id``."""
    return pd.DataFrame(
        {
            "request_id": request_id,
            SESSION: answer[SESSION].to_numpy(),
            "item_ids": list(answer["item_ids"]),
            "scores": list(answer["item_scores"]),
            "branch": answer["branch"].to_numpy(),
            "variant": answer["variant"].to_numpy(),
        }
    )


def assert_logged_once(log: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Each expected (request, session) is in ``log`` exactly once, with its items and scores to
    the last bit, and ``log`` holds nothing else."""
    keys = list(zip(log["request_id"], log[SESSION], strict=True))
    assert len(keys) == len(set(keys)), "a session of a request was logged twice"
    wanted = list(zip(expected["request_id"], expected[SESSION], strict=True))
    assert sorted(keys) == sorted(wanted)
    by_key = dict(zip(keys, log.itertuples(index=False), strict=True))
    for row in expected.itertuples(index=False):
        got = by_key[(row.request_id, getattr(row, SESSION))]
        np.testing.assert_array_equal(np.asarray(got.item_ids), np.asarray(row.item_ids))
        np.testing.assert_array_equal(np.asarray(got.scores), np.asarray(row.scores))
        assert (got.branch, got.variant) == (row.branch, row.variant)


def folder_files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# ---- logs and clicks made up for the read-out ----------------------------------------------------

T0 = pd.Timestamp("2026-01-01", tz="UTC")


def answer(session, seconds, items, variant=None, branch=None, request=None):
    return {
        "request_id": request or f"r{session}-{seconds}",
        "session_id": session,
        "answered_at": T0 + pd.Timedelta(seconds=seconds),
        "branch": branch,
        "variant": variant,
        "item_ids": np.array(items, dtype=np.int64),
        "scores": np.linspace(1, 0, len(items), dtype=np.float32),
    }


def clicks(*rows):
    """(session, item, seconds after T0) per click."""
    frame = pd.DataFrame(rows, columns=["session_id", "item_id", "timestamp"])
    frame["timestamp"] = frame["timestamp"] + T0.timestamp()
    return frame


def synthetic_experiment(weights: dict, hit_chance: dict, sessions: int = 3000, seed: int = 0):
    """A log and the clicks after it: each session gets 1 to 5 answers of 10 items from its
    variant; its next click is the answer's item at a random position with the variant's chance,
    else an item never shown."""
    rng = np.random.default_rng(seed)
    experiment = Experiment("synthetic", weights)
    ids = np.arange(sessions) + 10_000
    variants = np.array(experiment.variants)[experiment.assign(ids)]
    rows, click_rows = [], []
    for session, variant in zip(ids, variants, strict=True):
        for turn in range(int(rng.integers(1, 6))):
            at = turn * 60
            items = rng.choice(500, 10, replace=False)
            rows.append(answer(int(session), at, items, variant, variant))
            hit = rng.random() < hit_chance[variant]
            clicked = items[rng.integers(0, 10)] if hit else 1000 + int(rng.integers(0, 500))
            click_rows.append((int(session), int(clicked), at + 30))
    return pd.DataFrame(rows), clicks(*click_rows)
