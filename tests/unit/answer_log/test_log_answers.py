"""LogAnswers in this process: every session of an answer recorded once with its items, scores,
branch and variant; sampling by session, hashed ids; nothing of warm-ups or batch scoring; each
session of a merged run under its own request's id."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import (
    Ensemble,
    LogAnswers,
    ParquetFolder,
    SchemaError,
    read_answers,
)
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.export.python_model import HostedStep
from merlin_torch_serving.graph import answering
from merlin_torch_serving.graph.rehearsal import rehearsing
from tests import routed_graphs
from tests.answer_logs import answered_sessions, assert_logged_once, logged_routed, rows


def test_every_session_of_an_answer_is_logged_once_with_its_items_scores_branch_and_variant(
    tmp_path, toy_workflow, toy_model
):
    ensemble, log = logged_routed(toy_workflow, toy_model, ParquetFolder(tmp_path / "log"))
    answers = [ensemble.transform(rows(n, seed=n, first=1000 * n)) for n in (1, 7, 20)]
    assert log.flush(timeout_s=30)
    logged = read_answers(tmp_path / "log")

    ids = logged.groupby("session_id")["request_id"].first()
    expected = [answered_sessions(a, ids[a["session_id"].iloc[0]]) for a in answers]
    assert_logged_once(logged, pd.concat(expected))
    assert logged.groupby("request_id").size().sort_values().tolist() == [1, 7, 20]
    assert set(logged["variant"]) == {"current", "candidate"}
    assert (logged["ensemble"] == "").all()  # in-process: no export answered
    assert log.status().written == 28
    assert not log.status().failing


def test_a_log_without_the_session_id_among_its_inputs_says_how_to_pass_it(
    tmp_path, toy_workflow, toy_model
):
    graph = routed_graphs.routed(toy_workflow, toy_model) >> LogAnswers(
        ParquetFolder(tmp_path / "log")
    )
    with pytest.raises(
        SchemaError, match=r"'session_id'.*pass session_ids=features\['session_id'\]"
    ):
        Ensemble(graph, toy_workflow.input_schema)


def test_a_sample_keeps_every_answer_of_its_sessions_and_none_of_the_others(
    tmp_path, toy_workflow, toy_model
):
    ensemble, log = logged_routed(
        toy_workflow, toy_model, ParquetFolder(tmp_path / "log"), sample_rate=0.5
    )
    request = rows(60, seed=1)
    ensemble.transform(request)
    ensemble.transform(request)
    assert log.flush(timeout_s=30)
    logged = read_answers(tmp_path / "log")

    per_session = logged.groupby("session_id").size()
    assert (per_session == 2).all()  # both answers of a sampled session
    assert 15 <= len(per_session) <= 45  # about half of the 60 sessions


def test_hashed_session_ids_are_the_keyed_blake2b_of_the_ids(tmp_path, toy_workflow, toy_model):
    ensemble, log = logged_routed(
        toy_workflow, toy_model, ParquetFolder(tmp_path / "log"), session_id_key="secret"
    )
    answer = ensemble.transform(rows(3, seed=2))
    assert log.flush(timeout_s=30)
    logged = read_answers(tmp_path / "log")

    expected = {
        hashlib.blake2b(str(s).encode(), key=b"secret", digest_size=16).hexdigest()
        for s in answer["session_id"]
    }
    assert set(logged["session_id"]) == expected


@pytest.mark.parametrize("kind", ["warm-up", "batch scoring"])
def test_answers_nobody_sees_are_not_logged(tmp_path, toy_workflow, toy_model, kind):
    ensemble, log = logged_routed(toy_workflow, toy_model, ParquetFolder(tmp_path / "log"))
    nobody = (
        rehearsing()
        if kind == "warm-up"
        else answering.answering(answering.Answering(answering.SCORING))
    )
    with nobody:
        ensemble.transform(rows(3, seed=2))
    assert log.status() is None  # nothing was handed to a writer
    assert not (tmp_path / "log").exists()


def test_each_session_of_a_merged_run_is_logged_under_its_own_request_id(
    tmp_path, toy_workflow, toy_model
):
    """A batched step answers Triton's batch in merged runs (``export.merging``); the log still
    knows which request each session came from."""
    ensemble, _log = logged_routed(toy_workflow, toy_model, ParquetFolder(tmp_path / "log"))
    result = ensemble.export(tmp_path / "repository", "logged")
    step_dir = tmp_path / "repository" / result.models[0] / "1"
    step = HostedStep.load(str(step_dir))
    requests = [rows(n, seed=n, first=1000 * n) for n in (2, 3, 1)]
    arrays = [wire.to_wire(frames.frame_to_table(r, toy_workflow.input_schema)) for r in requests]
    whom = answering.Answering(
        answering.SERVED, ("a", "b", ""), ensemble="logged", ensemble_version=1, model="m"
    )
    answers = step.run_batch(arrays, whom)
    step.close()
    logged = read_answers(tmp_path / "log")

    by_request = logged.groupby("request_id")["session_id"].apply(sorted).to_dict()
    made_up = next(key for key in by_request if key not in ("a", "b"))
    assert by_request == {
        "a": [2000, 2001],
        "b": [3000, 3001, 3002],
        made_up: [1000],  # a request sent without an id gets one of its own
    }
    assert (logged["ensemble"] == "logged").all()
    assert (logged["ensemble_version"] == 1).all()
    logged_b = logged[logged["request_id"] == "b"].sort_values("session_id")
    np.testing.assert_array_equal(np.stack(logged_b["item_ids"]), answers[1]["item_ids"])
