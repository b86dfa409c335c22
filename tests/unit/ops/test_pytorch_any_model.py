"""PredictPytorch with models of every shape users bring: positional or dict forward, eager or
TorchScript, a Transformers4Rec save folder, a bare TorchScript with one sample input."""

import json
import logging

import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import (
    Ensemble,
    ModelNotImportableError,
    ModelPreparationError,
    PredictPytorch,
)
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.export.python_model import HostedStep
from tests import any_models, toy_session

PRICES = np.array([[1.0, 2.0, 3.0], [-4.0, 1.0, 0.0], [0.5, 0.5, 0.5]], dtype=np.float32)
CLICKS = np.array([3, 0, 7], dtype=np.int64)


def positional_request():
    return TensorTable({"price": PRICES, "clicks": CLICKS})


def eager_positional_answer():
    with torch.no_grad():
        score, weighted = any_models.PositionalScorer()(
            torch.from_numpy(PRICES), torch.from_numpy(CLICKS)
        )
    return score.numpy(), weighted.numpy()


@pytest.mark.parametrize("backend", ["python", "pytorch"])
@pytest.mark.parametrize("scripted", [True, False], ids=["torchscript", "eager"])
def test_a_positional_model_answers_like_the_eager_model_on_both_backends(
    backend, scripted, tmp_path
):
    model = (
        torch.jit.script(any_models.PositionalScorer())
        if scripted
        else any_models.PositionalScorer()
    )
    op = PredictPytorch(
        model, any_models.POSITIONAL_INPUTS, any_models.POSITIONAL_OUTPUTS, backend=backend
    )
    ensemble = Ensemble(op, any_models.POSITIONAL_INPUTS)
    expected_score, expected_weighted = eager_positional_answer()

    result = ensemble.run(positional_request())
    np.testing.assert_array_equal(result["score"].values, expected_score)
    np.testing.assert_array_equal(result["weighted"].values, expected_weighted)

    ensemble.export(tmp_path, "positional")
    step = tmp_path / "positional-0-predictpytorch" / "1"
    arrays = wire.to_wire(positional_request())
    if backend == "pytorch":  # as libtorch calls it: one Dict[str, Tensor], outputs by position
        module = torch.jit.load(str(step / "model.pt"))
        with torch.inference_mode():
            served = [
                t.numpy() for t in module({name: torch.from_numpy(a) for name, a in arrays.items()})
            ]
    else:  # as the python backend runs it
        outputs = HostedStep.load(str(step)).run(arrays)
        served = [outputs["score"], outputs["weighted"]]
    np.testing.assert_array_equal(served[0], expected_score)
    np.testing.assert_array_equal(served[1], expected_weighted)


def test_positional_inputs_named_by_tritons_index_convention_are_bound_by_position():
    renamed = Schema(
        [c.with_name(f"INPUT__{i}") for i, c in enumerate(any_models.POSITIONAL_INPUTS)]
    )
    op = PredictPytorch(
        torch.jit.script(any_models.PositionalScorer()), renamed, any_models.POSITIONAL_OUTPUTS
    )
    result = Ensemble(op, renamed).run(TensorTable({"INPUT__0": PRICES, "INPUT__1": CLICKS}))
    np.testing.assert_array_equal(result["score"].values, eager_positional_answer()[0])


def test_the_data_dependent_model_runs_eagerly_answers_like_it_and_says_so(caplog):
    rows = np.array([[-1, -1, -1, -1], [1, 2, 3, 4], [-1, 2, -3, 1]], dtype=np.float32)
    with caplog.at_level(logging.INFO, logger="merlin_torch_serving"):
        op = PredictPytorch(
            any_models.SignedRowSum(), any_models.SIGNED_INPUTS, Schema([ColumnSchema("total")])
        )
    assert op.backend == "python"
    assert "PredictPytorch: model SignedRowSum runs eagerly on the python backend" in caplog.text
    result = Ensemble(op, any_models.SIGNED_INPUTS).run(TensorTable({"x": rows}))
    assert result["total"].values.tolist() == [4.0, 10.0, 1.0]


def test_libtorch_is_refused_for_a_model_that_only_runs_eagerly():
    with pytest.raises(
        ModelPreparationError, match="model 'SignedRowSum': cannot become TorchScript"
    ):
        PredictPytorch(
            any_models.SignedRowSum(),
            any_models.SIGNED_INPUTS,
            Schema([ColumnSchema("total")]),
            backend="pytorch",
        )


def test_an_eager_step_is_exported_whole_and_reloads_from_its_files(tmp_path):
    op = PredictPytorch(
        any_models.SignedRowSum(), any_models.SIGNED_INPUTS, Schema([ColumnSchema("total")])
    )
    Ensemble(op, any_models.SIGNED_INPUTS).export(tmp_path, "signed")
    step = tmp_path / "signed-0-predictpytorch" / "1"
    (call,) = json.loads((step / "step.json").read_text())["calls"]
    assert call["config"]["execution"] == "eager"
    assert (step / "ops" / "0" / "eager_model.pt").is_file()
    manifest = json.loads((tmp_path / "signed" / "1" / "manifest.json").read_text())
    assert manifest["steps"][0]["operators"][0]["parameters"]["execution"] == "eager"

    outputs = HostedStep.load(str(step)).run({"x": np.array([[-1, -1, -1, -1]], dtype=np.float32)})
    assert outputs["total"].tolist() == [4.0]


def test_exporting_a_model_that_cannot_be_pickled_names_its_class_and_writes_nothing(tmp_path):
    import threading

    class HoldsALock(torch.nn.Module):  # saved by value, like any class the server cannot import
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()

        def forward(self, inputs):
            with self.lock:
                return torch.stack(
                    [row.sum() if row.sum() > 0 else -row.sum() for row in inputs["x"]]
                )

    ensemble = Ensemble(
        PredictPytorch(HoldsALock(), any_models.SIGNED_INPUTS, Schema([ColumnSchema("total")])),
        any_models.SIGNED_INPUTS,
    )
    with pytest.raises(
        ModelNotImportableError,
        match=(
            r"model class '[\w.]*<locals>\.HoldsALock' cannot be loaded by the server's Python"
            r" \(pickle cannot save it: cannot pickle '_thread.lock' object\)"
        ),
    ):
        ensemble.export(tmp_path / "repository", "local")
    assert not (tmp_path / "repository").exists()


def test_a_dict_returning_model_names_its_outputs_by_the_output_schema():
    outputs = Schema([ColumnSchema("largest"), ColumnSchema("total")])
    op = PredictPytorch(any_models.DictScores(), any_models.SIGNED_INPUTS, outputs)
    result = Ensemble(op, any_models.SIGNED_INPUTS).run(
        TensorTable({"x": np.array([[1, 5, 2, 0]], dtype=np.float32)})
    )
    assert result["largest"].values.tolist() == [5.0]
    assert result["total"].values.tolist() == [8.0]


def test_a_schema_derived_from_a_sample_equals_the_hand_written_one(tmp_path):
    scripted = torch.jit.script(any_models.PositionalScorer())
    hand_written = PredictPytorch(
        scripted,
        Schema(
            [
                ColumnSchema("price", dtype="float32", dims=(None, 3)),
                ColumnSchema("clicks", dtype="int64", dims=(None,)),
            ]
        ),
        Schema(
            [
                ColumnSchema("OUTPUT__0", dtype="float32", dims=(None,)),
                ColumnSchema("OUTPUT__1", dtype="float32", dims=(None, 3)),
            ]
        ),
    )
    from_sample = PredictPytorch(
        scripted, sample=(torch.ones(2, 3), torch.zeros(2, dtype=torch.int64))
    )

    assert from_sample.model_input_schema == hand_written.model_input_schema
    assert from_sample.model_output_schema == hand_written.model_output_schema
    for name, op in (("hand", hand_written), ("sample", from_sample)):
        Ensemble(op, op.model_input_schema).export(tmp_path / name, "scorer")
    config = "scorer-0-predictpytorch/config.pbtxt"
    assert (tmp_path / "sample" / config).read_text() == (tmp_path / "hand" / config).read_text()


def test_a_transformers4rec_save_folder_is_served_from_its_path(toy_workflow, tmp_path):
    from examples.session_based import model

    t4r = model.build_model(
        toy_workflow.output_schema, max_sequence_length=toy_session.MAX_SEQUENCE_LENGTH, d_model=16
    ).eval()
    t4r.save(tmp_path / "saved")
    op = PredictPytorch(str(tmp_path / "saved"), backend="python")
    features = toy_workflow.transform(toy_session.interactions(6, seed=4))
    result = Ensemble(op, toy_workflow.output_schema.select_by_name(op.root_columns())).run(
        frames.frame_to_table(features[op.root_columns()])
    )

    dense = model.padded_inputs(features, max_sequence_length=toy_session.MAX_SEQUENCE_LENGTH)
    with torch.no_grad():
        expected = t4r(dense).numpy()
    np.testing.assert_array_equal(result[op.model_output_schema.column_names[0]].values, expected)
