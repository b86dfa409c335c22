import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, TransformWorkflow
from merlin_torch_serving.data import frames
from merlin_torch_serving.ops.session_rows import take_rows
from tests import toy_session


def test_transform_workflow_returns_sessions_in_first_appearance_order(toy_workflow):
    rows = toy_session.interactions(6, seed=4)
    shuffled = rows.sample(frac=1.0, random_state=7).reset_index(drop=True)
    ensemble = Ensemble(TransformWorkflow(toy_workflow), toy_workflow.input_schema)

    result = ensemble.transform(shuffled)

    assert result["session_id"].tolist() == list(pd.unique(shuffled["session_id"]))


def test_transform_workflow_matches_nvtabular_row_for_row(toy_workflow):
    rows = toy_session.interactions(8, seed=5)
    expected = toy_workflow.transform(rows).set_index("session_id")
    result = Ensemble(TransformWorkflow(toy_workflow), toy_workflow.input_schema).transform(rows)
    for _, row in result.iterrows():
        want = expected.loc[row["session_id"]]
        assert list(row["item_id-list"]) == list(want["item_id-list"])
        assert list(row["category-list"]) == list(want["category-list"])
        assert row["item_id-count"] == want["item_id-count"]


def test_transform_workflow_keeps_sorted_order_when_asked(toy_workflow):
    rows = toy_session.interactions(5, seed=6).iloc[::-1]
    op = TransformWorkflow(toy_workflow, keep_request_order=False)
    result = Ensemble(op, toy_workflow.input_schema).transform(rows)
    assert result["session_id"].tolist() == sorted(rows["session_id"].unique())


def test_take_rows_reorders_ragged_and_scalar_columns_together():
    table = TensorTable(
        {"l": (np.array([1, 2, 3, 4, 5, 6]), np.array([0, 1, 3, 6])), "s": np.array([10, 20, 30])}
    )
    taken = take_rows(table, np.array([2, 0]))
    assert frames.table_to_frame(taken)["l"].map(list).tolist() == [[4, 5, 6], [1]]
    assert taken["s"].values.tolist() == [30, 10]


def test_fast_path_and_nvtabular_path_give_the_same_table(toy_workflow):
    rows = toy_session.interactions(12, seed=8)
    rows.loc[rows.index[::4], "item_id"] = (
        99_999  # never seen in training: out-of-vocabulary bucket
    )
    shuffled = rows.sample(frac=1.0, random_state=3).reset_index(drop=True)

    fast = Ensemble(TransformWorkflow(toy_workflow), toy_workflow.input_schema).transform(shuffled)
    slow = Ensemble(
        TransformWorkflow(toy_workflow, fast_path=False), toy_workflow.input_schema
    ).transform(shuffled)

    assert list(fast.columns) == list(slow.columns)
    for name in fast.columns:
        assert [np.asarray(cell).tolist() for cell in fast[name]] == [
            np.asarray(cell).tolist() for cell in slow[name]
        ], name
    assert fast["item_id-list"].map(len).sum() > 0


@pytest.fixture(scope="module")
def tied_clicks():
    """Clicks of 200 sessions, most of a session's clicks sharing their timestamp, shuffled."""
    rows = toy_session.tied_interactions(200, seed=3)
    return rows.sample(frac=1.0, random_state=3).reset_index(drop=True)


@pytest.fixture(scope="module")
def workflow_paths(toy_workflow, tied_clicks):
    """fast path or not -> (the ensemble, its answer to all of ``tied_clicks`` by session)."""
    paths = {}
    for fast_path in (True, False):
        ensemble = Ensemble(
            TransformWorkflow(toy_workflow, fast_path=fast_path), toy_workflow.input_schema
        )
        paths[fast_path] = (ensemble, ensemble.transform(tied_clicks).set_index("session_id"))
    return paths


@settings(max_examples=8, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "nvtabular"])
def test_a_sessions_features_depend_only_on_its_own_clicks_whatever_shares_the_request(
    workflow_paths, tied_clicks, fast_path, data
):
    ensemble, whole = workflow_paths[fast_path]
    sessions = tied_clicks["session_id"].unique()
    pieces = data.draw(st.integers(2, 8), label="pieces")
    piece_of = dict(
        zip(
            sessions,
            data.draw(
                st.lists(
                    st.integers(0, pieces - 1), min_size=len(sessions), max_size=len(sessions)
                ),
                label="piece of each session",
            ),
            strict=True,
        )
    )
    for piece in range(pieces):
        rows = tied_clicks[tied_clicks["session_id"].map(piece_of) == piece]
        if rows.empty:
            continue
        answer = ensemble.transform(rows).set_index("session_id")
        expected = whole.loc[answer.index]
        for name in answer.columns:
            for session, got, want in zip(answer.index, answer[name], expected[name], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=f"{name!r} of session {session}")


def test_loaded_transform_workflow_is_compiled_before_its_first_request(toy_workflow, tmp_path):
    operator = TransformWorkflow(toy_workflow)
    operator.save_artifacts(str(tmp_path))
    loaded = TransformWorkflow.load(operator.config(), str(tmp_path))
    assert loaded._compiled is not None
    assert loaded.compiled_workflow().fallbacks == []


def test_a_workflow_that_was_never_fitted_is_refused_naming_the_fix(tmp_path):
    import nvtabular as nvt

    from merlin_torch_serving import WorkflowNotFittedError

    unfitted = nvt.Workflow(["item_id", "category"] >> nvt.ops.Categorify(out_path=str(tmp_path)))
    with pytest.raises(WorkflowNotFittedError) as refused:
        TransformWorkflow(unfitted)
    assert (
        str(refused.value)
        == "fit the NVTabular workflow first: workflow.fit(dataset), or load a fitted one with"
        " nvtabular.Workflow.load(path); this one is not fitted (operators without statistics:"
        " Categorify)"
    )
