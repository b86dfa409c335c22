import pandas as pd
import pytest
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import (
    Ensemble,
    LocalExecutor,
    PredictPytorch,
    SchemaError,
    TopK,
    TransformWorkflow,
)
from tests import toy_session
from tests.fan_out import REQUEST_SCHEMA, fan_out_graph, transforms_counted


def test_schemas_propagate_edge_by_edge(toy_workflow, toy_model):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    assert ensemble.output_schema.column_names == ["session_id", "item_ids", "item_scores"]
    assert [call.op.label for call in ensemble.plan.calls] == [
        "TransformWorkflow",
        "PredictPytorch[python]",
        "TopK(k=3)",
    ]
    predict = ensemble.plan.calls[1]
    assert list(predict.inputs) == ["item_id-list", "category-list"]
    assert (
        predict.output_schema["next-item"].shape.as_tuple[1]
        == toy_model[2]["next-item"].shape.as_tuple[1]
    )


def test_operators_chain_directly_with_rshift(toy_workflow, toy_model):
    scripted, input_schema, output_schema = toy_model
    chain = (
        TransformWorkflow(toy_workflow)
        >> PredictPytorch(scripted, input_schema, output_schema)
        >> TopK(4)
    )
    ensemble = Ensemble(chain, toy_workflow.input_schema)
    result = ensemble.transform(toy_session.interactions(3, seed=1))
    assert len(result) == 3
    assert all(len(ids) == 4 for ids in result["item_ids"])


def test_a_missing_column_names_the_operator_the_column_and_what_came(toy_workflow, toy_model):
    scripted, input_schema, output_schema = toy_model
    wrong = toy_workflow.input_schema.column_names >> TransformWorkflow(toy_workflow)
    graph = wrong[["session_id", "item_id-list"]] >> PredictPytorch(
        scripted, input_schema, output_schema
    )
    with pytest.raises(
        SchemaError,
        match=(
            r"column 'category-list' at the input of PredictPytorch\[pytorch\]: expected int64"
            r" ragged "
            r"list, got no such column \(its parents provide 'session_id', 'item_id-list'\)"
        ),
    ):
        Ensemble(graph, toy_workflow.input_schema)


def test_a_dtype_mismatch_names_both_dtypes(toy_model):
    scripted, input_schema, output_schema = toy_model
    floats = Schema([c.with_dtype("float32") for c in input_schema])
    with pytest.raises(
        SchemaError, match=r"'item_id-list'.*expected int64 ragged list, got float32 ragged list"
    ):
        Ensemble(
            input_schema.column_names >> PredictPytorch(scripted, input_schema, output_schema),
            floats,
        )


def test_a_shape_mismatch_names_both_shapes(toy_model):
    scripted, input_schema, output_schema = toy_model
    scalars = Schema([ColumnSchema(c.name, dtype="int64") for c in input_schema])
    with pytest.raises(
        SchemaError, match=r"'item_id-list'.*expected int64 ragged list, got int64 scalar"
    ):
        Ensemble(
            input_schema.column_names >> PredictPytorch(scripted, input_schema, output_schema),
            scalars,
        )


def test_a_request_column_missing_from_the_input_schema_is_a_schema_error(toy_workflow):
    partial = toy_workflow.input_schema.excluding_by_name(["timestamp"])
    with pytest.raises(SchemaError, match="timestamp"):
        Ensemble(TransformWorkflow(toy_workflow), partial)


def test_non_serving_operators_are_rejected_with_a_hint(toy_workflow):
    import nvtabular as nvt

    with pytest.raises(SchemaError, match=r"Categorify.*serving operator.*TransformWorkflow"):
        Ensemble(["item_id"] >> nvt.ops.Categorify(), toy_workflow.input_schema)


def test_transform_and_explicit_local_executor_agree(toy_workflow, toy_model):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    rows = toy_session.interactions(7, seed=2)
    implicit = ensemble.transform(rows)
    explicit = ensemble.transform(rows, executor=LocalExecutor())
    pd.testing.assert_frame_equal(implicit, explicit)


def test_recommendations_leave_out_seen_and_reserved_items(toy_workflow, toy_model):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema
    )
    rows = toy_session.interactions(10, seed=8)
    result = ensemble.transform(rows)
    features = toy_workflow.transform(rows).set_index("session_id")
    for session, ids in zip(result["session_id"], result["item_ids"], strict=True):
        seen = set(features.loc[session, "item_id-list"])
        assert not (set(ids) & seen), session
        assert min(ids) >= 3


def test_exporting_never_changes_the_ensemble(toy_workflow, toy_model, tmp_path):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="pytorch"),
        toy_workflow.input_schema,
    )
    rows = toy_session.interactions(6, seed=9)
    before = ensemble.transform(rows)
    ensemble.export(tmp_path / "first")
    ensemble.export(tmp_path / "second")
    after = ensemble.transform(rows)
    pd.testing.assert_frame_equal(before, after)
    assert [call.op.label for call in ensemble.plan.calls][1] == "PredictPytorch[pytorch]"


def test_a_node_read_by_three_branches_runs_once_per_request_in_process(tmp_path):
    counter = tmp_path / "transforms"
    ensemble = Ensemble(fan_out_graph(counter), REQUEST_SCHEMA)
    for requests in (1, 2, 3):
        answer = ensemble.transform(pd.DataFrame({"x": [1.0, 2.0, 3.0]}, dtype="float32"))
        assert transforms_counted(counter) == requests
    assert answer["tripled"].tolist() == answer["summed"].tolist() == [3.0, 6.0, 9.0]
