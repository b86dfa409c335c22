"""Models of every shape, served on the real tritonserver: answers equal the in-process ensemble
exactly, and the eager model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import (
    Ensemble,
    PredictPytorch,
    TopK,
    TransformWorkflow,
    TritonExecutor,
)
from merlin_torch_serving.data import frames
from tests import any_models, toy_session
from tests.session_models import SERVED_TORCH_THREADS, torch_threads

pytestmark = pytest.mark.integration


def served(triton_server, ensemble: Ensemble, name: str, request: TensorTable) -> TensorTable:
    ensemble.export(triton_server.repository, name)
    triton_server.load(name)
    return ensemble.run(request, executor=TritonExecutor(triton_server.grpc_url, name))


def assert_tables_equal(got: TensorTable, expected: TensorTable) -> None:
    assert got.columns == expected.columns
    for name in expected.columns:
        np.testing.assert_array_equal(got[name].values, expected[name].values, err_msg=name)
        if expected[name].offsets is not None:
            np.testing.assert_array_equal(got[name].offsets, expected[name].offsets, err_msg=name)


@pytest.mark.parametrize("backend", ["python", "pytorch"])
def test_a_positional_torchscript_model_is_served_on_both_backends(request, triton_server, backend):
    if backend == "pytorch":
        request.getfixturevalue(
            "pytorch_backend"
        )  # fails, naming how to build it, when it is missing
    op = PredictPytorch(
        torch.jit.script(any_models.PositionalScorer()),
        any_models.POSITIONAL_INPUTS,
        any_models.POSITIONAL_OUTPUTS,
        backend=backend,
    )
    ensemble = Ensemble(op, any_models.POSITIONAL_INPUTS)
    prices = np.array([[1, 2, 3], [-4, 1, 0], [-9, -9, -9], [0.25, 0, 1]], dtype=np.float32)
    request = TensorTable({"price": prices, "clicks": np.array([3, 0, 1, 20])})

    answer = served(triton_server, ensemble, f"positional-{backend}", request)

    assert_tables_equal(answer, ensemble.run(request))  # in-process, with the served thread count
    with torch.no_grad(), torch_threads(SERVED_TORCH_THREADS):
        score, weighted = any_models.PositionalScorer()(
            torch.from_numpy(prices), torch.from_numpy(request["clicks"].values)
        )
    np.testing.assert_array_equal(answer["score"].values, score.numpy())
    np.testing.assert_array_equal(answer["weighted"].values, weighted.numpy())


def test_the_data_dependent_model_is_served_eagerly_and_answers_like_it(triton_server):
    op = PredictPytorch(
        any_models.SignedRowSum(), any_models.SIGNED_INPUTS, Schema([ColumnSchema("total")])
    )
    ensemble = Ensemble(op, any_models.SIGNED_INPUTS)
    rows = np.array(
        [[-1, -1, -1, -1], [1, 2, 3, 4], [-1, 2, -3, 1], [0, 0, 0, 0], [5, -6, 0, 0]],
        dtype=np.float32,
    )
    request = TensorTable({"x": rows})

    answer = served(triton_server, ensemble, "signed-row-sum", request)

    assert answer["total"].values.tolist() == [4.0, 10.0, 1.0, 0.0, 1.0]
    with torch.no_grad():
        np.testing.assert_array_equal(
            answer["total"].values, any_models.SignedRowSum()({"x": torch.from_numpy(rows)}).numpy()
        )
    assert_tables_equal(answer, ensemble.run(request))  # in-process, with the served thread count
    assert "model SignedRowSum runs eagerly on the python backend" in triton_server.logs()


def test_a_transformers4rec_save_folder_is_served_without_user_code(
    triton_server, toy_workflow, tmp_path
):
    from examples.session_based import model

    t4r = model.build_model(
        toy_workflow.output_schema, max_sequence_length=toy_session.MAX_SEQUENCE_LENGTH, d_model=16
    )
    t4r.eval().save(tmp_path / "t4r")
    features = toy_workflow.input_schema.column_names >> TransformWorkflow(toy_workflow)
    scores = features >> PredictPytorch(str(tmp_path / "t4r"), backend="python")
    top = scores >> TopK(4, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
    ensemble = Ensemble(features["session_id"] + top + scores, toy_workflow.input_schema)
    rows = toy_session.interactions(9, seed=31, first_session=8800)
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])

    answer = served(triton_server, ensemble, "t4r-folder", request)

    assert_tables_equal(answer, ensemble.run(request))  # in-process, with the served thread count
    sessions = toy_workflow.transform(rows)
    order = [list(sessions["session_id"]).index(s) for s in answer["session_id"].values]
    dense = model.padded_inputs(
        sessions.iloc[order], max_sequence_length=toy_session.MAX_SEQUENCE_LENGTH
    )
    with torch.no_grad(), torch_threads(SERVED_TORCH_THREADS):
        eager = t4r(dense).numpy()
    np.testing.assert_array_equal(answer["next-item"].values, eager)
