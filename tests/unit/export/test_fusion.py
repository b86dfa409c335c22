"""TopK compiled into the libtorch model it follows: same answer as in-process, and only when the
catalog's scores are needed nowhere else."""

import json

import numpy as np
import pytest
import torch
from merlin.dag import ColumnSelector
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import (
    DecodeItemIds,
    Ensemble,
    PredictPytorch,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.data import frames, wire
from tests import toy_session
from tests.repository_runner import response_arrays, run_repository


def test_fused_libtorch_model_returns_the_in_process_top_k_exactly(
    toy_workflow, toy_model, tmp_path
):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="pytorch", k=4),
        toy_workflow.input_schema,
    )
    ensemble.export(tmp_path, "reco")
    rows = toy_session.interactions(9, seed=21, first_session=7000)
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])
    expected = ensemble.run(request)

    # what the libtorch step receives: the workflow step's outputs, keyed by the config's input
    # names
    features = wire.to_wire(TransformWorkflow(toy_workflow).transform(ColumnSelector(), request))
    module = torch.jit.load(str(tmp_path / "reco-1-predictpytorch_topk" / "1" / "model.pt"))
    with torch.inference_mode():  # as the config asks of libtorch
        ids, scores = module(
            {name: torch.from_numpy(array) for name, array in features.items() if "list" in name}
        )

    np.testing.assert_array_equal(ids.numpy(), expected["item_ids"].values)
    np.testing.assert_array_equal(scores.numpy(), expected["item_scores"].values)
    # the seen items are left out inside the TorchScript too
    for row, seen in enumerate(
        np.split(features["item_id-list__values"], features["item_id-list__offsets"][1:-1])
    ):
        assert not set(ids[row].tolist()) & set(seen.tolist())


def test_top_k_stays_a_step_of_its_own_when_the_scores_are_also_an_output(
    toy_workflow, toy_model, tmp_path
):
    scripted, input_schema, output_schema = toy_model
    features = toy_workflow.input_schema.column_names >> TransformWorkflow(toy_workflow)
    scores = features >> PredictPytorch(scripted, input_schema, output_schema, backend="pytorch")
    graph = scores + (scores >> TopK(3, seen_items=features["item_id-list"]))
    result = Ensemble(graph, toy_workflow.input_schema).export(tmp_path, "reco")

    assert result.fused == {
        "reco-0-transformworkflow": ["TransformWorkflow"],
        "reco-1-predictpytorch": ["PredictPytorch[pytorch]"],
        "reco-2-topk": ["TopK(k=3)"],
    }
    manifest = json.loads((tmp_path / "reco" / "1" / "manifest.json").read_text())
    assert [step["backend"] for step in manifest["steps"]] == ["python", "pytorch", "python"]


def test_top_k_after_a_python_backend_model_fuses_with_the_python_step(
    toy_workflow, toy_model, tmp_path
):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python"),
        toy_workflow.input_schema,
    )
    result = ensemble.export(tmp_path, "reco")
    assert list(result.fused.values()) == [
        ["TransformWorkflow", "PredictPytorch[python]", "TopK(k=3)"]
    ]


def test_decoding_joins_the_fused_libtorch_model_and_returns_raw_ids(
    toy_workflow, toy_model, tmp_path
):
    scripted, input_schema, output_schema = toy_model
    features = toy_workflow.input_schema.column_names >> TransformWorkflow(toy_workflow)
    recommendations = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend="pytorch")
        >> TopK(5, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
        >> DecodeItemIds(toy_workflow)
    )
    ensemble = Ensemble(features["session_id"] + recommendations, toy_workflow.input_schema)
    result = ensemble.export(tmp_path, "reco")
    assert result.fused == {
        "reco-0-transformworkflow": ["TransformWorkflow"],
        "reco-1-predictpytorch_topk_decodeitemids": [
            "PredictPytorch[pytorch]",
            "TopK(k=5)",
            "DecodeItemIds('item_id')",
        ],
    }

    rows = toy_session.interactions(11, seed=23, first_session=7100)
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])
    expected = ensemble.run(request)
    features_out = wire.to_wire(
        TransformWorkflow(toy_workflow).transform(ColumnSelector(), request)
    )
    module = torch.jit.load(
        str(tmp_path / "reco-1-predictpytorch_topk_decodeitemids" / "1" / "model.pt")
    )
    with torch.inference_mode():
        ids, scores = module(
            {
                name: torch.from_numpy(array)
                for name, array in features_out.items()
                if "list" in name
            }
        )

    np.testing.assert_array_equal(ids.numpy(), expected["item_ids"].values)
    np.testing.assert_array_equal(scores.numpy(), expected["item_scores"].values)
    assert ids.min() >= 500  # raw ids of toy_session start at 500


# ---- the blanking of filtered sessions -----------------------------------------------------------


class ScoresAndIds(torch.nn.Module):
    """A model that ranks by itself, like Transformers4Rec with top_k.

    It returns (scores, ids) of the 3 best.
    """

    def __init__(self, scorer: torch.nn.Module):
        super().__init__()
        self.scorer = scorer

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        best = torch.topk(self.scorer(inputs), 3)
        return best.values, best.indices


@pytest.fixture(scope="module")
def filtered_workflow(tmp_path_factory):
    return toy_session.fitted_workflow(tmp_path_factory.mktemp("filtered_toy"), minimum_clicks=2)


def filtered_request(workflow):
    """Shuffled rows of sessions of 1 to 9 clicks: the one-click ones are filtered out."""
    rows = toy_session.interactions(12, seed=31, first_session=7200)
    return frames.frame_to_table(
        rows.sample(frac=1.0, random_state=3)[workflow.input_schema.column_names]
    )


def exported_answer(ensemble, tmp_path, request):
    """The repository's answer run step by step, and the in-process one, as response tensors; the
    blanking must have joined the libtorch step."""
    result = ensemble.export(tmp_path, "reco")
    assert list(result.fused) == [
        "reco-0-transformworkflow",
        "reco-1-predictpytorch_blankfilteredrows",
    ]
    names = ensemble.input_schema.column_names
    return run_repository(tmp_path, "reco", wire.to_wire(request)), response_arrays(
        ensemble.run(request), names
    )


def assert_same_arrays(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_blanking_joins_a_single_output_libtorch_model(filtered_workflow, tmp_path):
    scripted, input_schema, output_schema = toy_session.scripted_model(filtered_workflow)
    features = filtered_workflow.input_schema.column_names >> TransformWorkflow(filtered_workflow)
    ensemble = Ensemble(
        features >> PredictPytorch(scripted, input_schema, output_schema),
        filtered_workflow.input_schema,
    )
    request = filtered_request(filtered_workflow)

    served, expected = exported_answer(ensemble, tmp_path, request)

    assert_same_arrays(served, expected)
    filtered = expected["filtered_out"]
    assert filtered.any()
    assert not filtered.all()
    assert np.isnan(expected["next-item"][filtered]).all()
    assert not np.isnan(expected["next-item"][~filtered]).any()


@pytest.mark.parametrize("order", ["model order", "reversed"])
def test_blanking_joins_a_two_output_libtorch_model_in_either_output_order(
    filtered_workflow, tmp_path, order
):
    scripted, input_schema, _ = toy_session.scripted_model(filtered_workflow)
    outputs = Schema([ColumnSchema("scores", dtype="float32"), ColumnSchema("ids", dtype="int64")])
    model = torch.jit.script(ScoresAndIds(scripted))
    features = filtered_workflow.input_schema.column_names >> TransformWorkflow(filtered_workflow)
    predictions = features >> PredictPytorch(model, input_schema, outputs)
    graph = predictions if order == "model order" else predictions["ids"] + predictions["scores"]
    ensemble = Ensemble(graph, filtered_workflow.input_schema)
    request = filtered_request(filtered_workflow)

    served, expected = exported_answer(ensemble, tmp_path, request)

    assert list(expected)[2:] == (
        ["scores", "ids"] if order == "model order" else ["ids", "scores"]
    )
    assert_same_arrays(served, expected)
    assert (expected["ids"][expected["filtered_out"]] == -1).all()


class FourOutputs(torch.nn.Module):
    def forward(
        self, inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x = inputs["x"]
        return x.sum(1), x * 2.0, x.max(1).values, x.min(1).values


FOUR_OUTPUTS_INPUT = Schema([ColumnSchema("x", dtype="float32", dims=(None, 3))])
FOUR_OUTPUTS = Schema([ColumnSchema(name) for name in ("total", "doubled", "largest", "smallest")])


def four_outputs_reading(read):
    predict = ["x"] >> PredictPytorch(
        torch.jit.script(FourOutputs()), FOUR_OUTPUTS_INPUT, FOUR_OUTPUTS, backend="pytorch"
    )
    return Ensemble(predict[read], FOUR_OUTPUTS_INPUT)


@pytest.mark.parametrize(
    "read",
    [["doubled"], ["total", "largest"], ["smallest", "doubled"], ["total", "doubled", "smallest"]],
)
def test_a_libtorch_model_returns_only_the_outputs_the_graph_reads(tmp_path, read):
    ensemble = four_outputs_reading(read)
    ensemble.export(tmp_path, "some")
    x = np.array([[1, -2, 3], [0.5, 4, -1]], dtype=np.float32)

    answer = run_repository(tmp_path, "some", {"x": x})

    expected = ensemble.run(TensorTable({"x": x}))
    assert sorted(answer) == sorted(read)
    for name in read:
        np.testing.assert_array_equal(answer[name], expected[name].values)
