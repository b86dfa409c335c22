"""Logged graphs for the answer log's tests, a small real filesystem to fill up, and comparing a
log with the answers it should hold."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import Ensemble, LogAnswers, TransformWorkflow
from tests import routed_graphs

SESSION = "session_id"


def logged_routed(workflow, model, destination, *, inline=("popular",), **options):
    """The routed toy graph (tests/routed_graphs.py) with every answer logged to ``destination``:
    (ensemble, its LogAnswers)."""
    features = workflow.input_schema.column_names >> TransformWorkflow(
        workflow, filtered_sessions="unfiltered"
    )
    log = LogAnswers(destination, session_ids=features[SESSION], **options)
    graph = routed_graphs.routed(workflow, model, inline=inline) >> log
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
