"""The official examples' workflows and models in-process: one row per session of the request, in
request order, with the session id; sessions the Filter drops answered and marked; the others as
the eager Transformers4Rec model ranks them (ids exact up to near ties, scores within
SCORE_TOLERANCE: the traced model scores another batch than the eager one, and XLNet's float32
matmuls may round differently with the batch's shape; on these requests they were equal).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.official.example import Example, request_rows
from tests.official.reference import eager_answer

SCORE_TOLERANCE = 1e-4


@pytest.fixture(scope="session")  # not rebuilt when the session-wide `example` switches
def ensembles(getting_started_example, end_to_end_example):
    return {
        example.name: example.ensemble()
        for example in (getting_started_example, end_to_end_example)
    }


def assert_like_eager(answer: pd.DataFrame, expected: pd.DataFrame, scores_column: str) -> None:
    """Same ids in the same order, except where two eager scores are closer than the tolerance
    (a near tie may swap); scores within the tolerance."""
    for session_id, ids, scores in zip(
        answer["session_id"], answer["item_ids"], answer[scores_column], strict=True
    ):
        want = expected.loc[session_id]
        np.testing.assert_allclose(
            scores,
            want["item_scores"],
            rtol=0,
            atol=SCORE_TOLERANCE,
            err_msg=f"session {session_id}",
        )
        for rank, (got, wanted) in enumerate(zip(ids, want["item_ids"], strict=True)):
            if got != wanted:
                assert abs(scores[rank] - want["item_scores"][rank]) <= SCORE_TOLERANCE
                if (
                    want["all_scores"] is not None
                ):  # our item scores like the eager one at this rank
                    assert np.isclose(
                        np.sort(want["all_scores"]), scores[rank], atol=SCORE_TOLERANCE
                    ).any()


@pytest.mark.parametrize("n_sessions", [1, 2, 7, 32])
def test_in_process_answers_every_session_like_the_eager_model(
    example: Example, ensembles, n_sessions
):
    rows = request_rows(example, n_sessions, seed=n_sessions)
    answer = ensembles[example.name].transform(rows)

    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))  # request order
    clicks = rows.groupby("session_id").size()
    filtered = (clicks[answer["session_id"]] < example.module.MINIMUM_SESSION_LENGTH).to_numpy()
    assert answer["filtered_out"].tolist() == filtered.tolist()
    assert (
        filtered.sum() == 1
    )  # the one-click session: the Filter drops it, the answer keeps its row
    for ids, scores in zip(
        answer["item_ids"][filtered], answer[example.scores_column][filtered], strict=True
    ):
        assert (ids == -1).all()
        assert np.isnan(scores).all()

    expected = eager_answer(example, rows)
    assert sorted(expected.index) == sorted(answer["session_id"][~filtered])
    assert_like_eager(answer[~filtered], expected, example.scores_column)


def test_over_long_sessions_reach_the_model_at_its_own_length(getting_started_example, ensembles):
    # ValueCount wrote the longest training list into the schema; the model reads 20 clicks
    schema_length = getting_started_example.workflow.output_schema["item_id-list"].shape.dims[1].max
    assert schema_length < 20
    rows = request_rows(getting_started_example, 2, seed=40)  # one-click and 27-click sessions
    answer = ensembles["getting_started"].transform(rows)
    assert sorted(answer["filtered_out"]) == [False, True]
    kept = answer[~answer["filtered_out"]]
    assert_like_eager(
        kept, eager_answer(getting_started_example, rows), getting_started_example.scores_column
    )


def test_the_session_id_can_be_left_out(getting_started_example):
    from merlin_torch_serving import Ensemble, PredictPytorch, TransformWorkflow

    workflow = getting_started_example.workflow
    features = workflow.input_schema.column_names >> TransformWorkflow(
        workflow, return_session_id=False
    )
    ensemble = Ensemble(
        features >> PredictPytorch(getting_started_example.model, backend="python"),
        workflow.input_schema,
    )
    assert ensemble.output_schema.column_names == ["filtered_out", "next-item"]
