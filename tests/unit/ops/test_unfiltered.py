"""Sessions the workflow's filters drop, computed as if no Filter had dropped them, for the
placeholder rows that stand for them (``TransformWorkflow(..., filtered_sessions="unfiltered")``).
"""

import numpy as np
import pytest
from merlin.table import TensorTable

from merlin_torch_serving import DecodeItemIds, Ensemble, PredictPytorch, TopK, TransformWorkflow
from merlin_torch_serving.ops.session_rows import FILTERED_COLUMN, line_up_sessions
from tests import toy_session
from tests.unit.ops.test_session_rows import workflow_rows


def test_computed_rows_stand_for_the_sessions_they_cover_and_empty_ones_for_the_rest():
    def unfiltered(keys):
        assert keys.tolist() == [7, 5]
        return TensorTable(
            {
                "session_id": np.array([7]),
                "items": (np.array([13]), np.array([0, 1], dtype=np.int32)),
                "count": np.array([1], dtype=np.int32),
            },
            _unsafe=True,
        )

    request_keys = np.array([9, 7, 9, 4, 7, 5])
    lined_up = line_up_sessions(
        workflow_rows(), request_keys, "session_id", FILTERED_COLUMN, unfiltered
    )
    assert lined_up["session_id"].values.tolist() == [9, 7, 4, 5]
    assert lined_up[FILTERED_COLUMN].values.tolist() == [False, True, False, True]
    assert lined_up["items"].offsets.tolist() == [0, 2, 3, 4, 4]
    assert lined_up["items"].values.tolist() == [11, 12, 13, 10]
    assert lined_up["count"].values.tolist() == [3, 1, 2, 0]


@pytest.fixture(scope="module")
def rows():
    return toy_session.interactions(30, seed=4)


def test_a_dropped_session_holds_its_own_features_and_the_others_are_unchanged(
    filtered_toy_workflow, rows
):
    workflow = filtered_toy_workflow
    empty = Ensemble(TransformWorkflow(workflow), workflow.input_schema).transform(rows)
    unfiltered = Ensemble(
        TransformWorkflow(workflow, filtered_sessions="unfiltered"), workflow.input_schema
    ).transform(rows)
    dropped = empty["filtered_out"].to_numpy()
    assert dropped.any()
    assert unfiltered["filtered_out"].tolist() == dropped.tolist()
    for column in empty.columns:
        for got, want in zip(unfiltered[column][~dropped], empty[column][~dropped], strict=True):
            np.testing.assert_array_equal(got, want)
    lengths = rows.groupby("session_id").size()
    for _, row in unfiltered[dropped].iterrows():
        clicks = rows[rows["session_id"] == row["session_id"]]
        assert len(row["item_id-list"]) == lengths[row["session_id"]] == len(clicks) == 1
        assert row["item_id-count"] == 1
        assert (row["item_id-list"] > 2).all()  # the click's item, encoded (it is known)


def test_what_is_computed_from_a_dropped_session_is_still_blanked(filtered_toy_workflow, rows):
    workflow = filtered_toy_workflow
    graphs = {}
    for kind in ("empty", "unfiltered"):
        features = workflow.input_schema.column_names >> TransformWorkflow(
            workflow, filtered_sessions=kind
        )
        scripted, input_schema, output_schema = toy_session.scripted_model(workflow)
        graphs[kind] = Ensemble(
            features
            >> PredictPytorch(scripted, input_schema, output_schema)
            >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
            >> DecodeItemIds(workflow),
            workflow.input_schema,
        ).transform(rows)
    for column in graphs["empty"].columns:
        for got, want in zip(graphs["unfiltered"][column], graphs["empty"][column], strict=True):
            np.testing.assert_array_equal(got, want)


def test_the_choice_is_checked_and_saved(filtered_toy_workflow):
    with pytest.raises(ValueError, match=r"filtered_sessions must be one of"):
        TransformWorkflow(filtered_toy_workflow, filtered_sessions="all")
    op = TransformWorkflow(filtered_toy_workflow, filtered_sessions="unfiltered")
    assert op.config()["filtered_sessions"] == "unfiltered"
