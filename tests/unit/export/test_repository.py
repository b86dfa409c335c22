import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import (
    Ensemble,
    ExportError,
    ModelCheckError,
    PredictPytorch,
    RepositoryExistsError,
)
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.export.python_model import HostedStep
from tests import toy_session


def snapshot(path: Path) -> dict:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def ensemble(toy_workflow, toy_model):
    return Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="pytorch"),
        toy_workflow.input_schema,
    )


def test_export_writes_one_folder_per_step_and_the_ensemble(ensemble, tmp_path):
    result = ensemble.export(tmp_path / "repo", "reco")
    assert result.models == ["reco-0-transformworkflow", "reco-1-predictpytorch_topk", "reco"]
    assert result.version == 1
    repo = tmp_path / "repo"
    assert (repo / "reco-1-predictpytorch_topk" / "1" / "model.pt").is_file()
    assert (repo / "reco-0-transformworkflow" / "1" / "model.py").is_file()
    assert (
        repo / "reco-0-transformworkflow" / "1" / "ops" / "0" / "workflow" / "workflow.pkl"
    ).is_file()
    assert sorted(p.name for p in repo.iterdir()) == sorted(result.models)


def test_manifest_records_schemas_parameters_versions_and_fusion(ensemble, tmp_path):
    ensemble.export(tmp_path, "reco")
    manifest = json.loads((tmp_path / "reco" / "1" / "manifest.json").read_text())
    assert manifest["ensemble"] == "reco"
    assert manifest["libraries"]["merlin-torch-serving"] == "0.1.0"
    assert manifest["libraries"]["nvtabular"].startswith("23.8")
    assert [f["name"] for f in manifest["output_schema"]["feature"]] == [
        "session_id",
        "item_ids",
        "item_scores",
    ]
    libtorch = manifest["steps"][1]
    assert libtorch["backend"] == "pytorch"
    assert libtorch["fused_operators"] == ["PredictPytorch[pytorch]", "TopK(k=3)"]
    assert libtorch["operators"][1]["parameters"]["k"] == 3
    assert libtorch["outputs"] == ["item_ids", "item_scores"]


def test_python_operators_fuse_into_one_model(toy_workflow, toy_model, tmp_path):
    fused = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python"),
        toy_workflow.input_schema,
    )
    result = fused.export(tmp_path, "reco")
    assert result.fused == {
        "reco-0-transformworkflow_predictpytorch_topk": [
            "TransformWorkflow",
            "PredictPytorch[python]",
            "TopK(k=3)",
        ]
    }


def test_export_refuses_to_overwrite_unless_asked(ensemble, tmp_path):
    ensemble.export(tmp_path, "reco")
    before = snapshot(tmp_path)
    with pytest.raises(
        RepositoryExistsError,
        match=r"already holds model\(s\) 'reco-0-transformworkflow'.*overwrite=True",
    ):
        ensemble.export(tmp_path, "reco")
    assert snapshot(tmp_path) == before
    ensemble.export(tmp_path, "reco", overwrite=True)
    assert (tmp_path / "reco" / "1").is_dir()


def test_overwriting_removes_the_steps_of_the_previous_export_that_it_does_not_write_again(
    ensemble, toy_workflow, toy_model, tmp_path
):
    python = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python"),
        toy_workflow.input_schema,
    )
    python.export(tmp_path, "reco")
    (tmp_path / "someone-else" / "1").mkdir(parents=True)

    ensemble.export(tmp_path, "reco", overwrite=True)  # the model step moves to libtorch

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "reco",
        "reco-0-transformworkflow",
        "reco-1-predictpytorch_topk",
        "someone-else",
    ]


def test_add_version_writes_version_n_plus_one_beside_version_n(ensemble, tmp_path):
    ensemble.export(tmp_path, "reco")
    version_one = snapshot(tmp_path / "reco-1-predictpytorch_topk" / "1")
    result = ensemble.export(tmp_path, "reco", add_version=True)
    assert result.version == 2
    for model in result.models:
        assert sorted(p.name for p in (tmp_path / model).iterdir() if p.name.isdigit()) == [
            "1",
            "2",
        ]
    assert snapshot(tmp_path / "reco-1-predictpytorch_topk" / "1") == version_one


def test_export_keeps_models_it_does_not_own(ensemble, tmp_path):
    other = tmp_path / "someone-else" / "1"
    other.mkdir(parents=True)
    (other / "model.py").write_text("# not ours\n")
    ensemble.export(tmp_path, "reco")
    assert (other / "model.py").read_text() == "# not ours\n"


class ShapeShifter(torch.nn.Module):
    """Declares [-1, 3] when probed with two different rows but returns [rows, 4] for the export's
    one-row warm-up sample (which the wrapper hands it repeated: see ``OneOutputWireModel``)."""

    def forward(self, inputs: dict[str, torch.Tensor]):
        items = inputs["item_id-list"]
        return torch.zeros(items.shape[0], 4 if bool((items == items[0]).all()) else 3)


def test_a_failed_export_leaves_the_previous_repository_as_it_was(ensemble, toy_workflow, tmp_path):
    ensemble.export(tmp_path / "repo", "reco")
    before = snapshot(tmp_path / "repo")
    items = toy_workflow.output_schema.select_by_name(["item_id-list"])
    bad = Ensemble(
        ["item_id-list"]
        >> PredictPytorch(
            torch.jit.script(ShapeShifter()), items, Schema([ColumnSchema("s", dtype="float32")])
        ),
        items,
    )
    with pytest.raises(
        ModelCheckError,
        match=(
            "model 'reco-0-predictpytorch' failed the libtorch check: output 's' expected dims"
            " \\[-1, 3\\], got shape \\[1, 4\\]"
        ),
    ):
        bad.export(tmp_path / "repo", "reco", overwrite=True)
    assert snapshot(tmp_path / "repo") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # no staging folder left


def test_invalid_model_names_and_conflicting_flags_are_rejected(ensemble, tmp_path):
    with pytest.raises(ExportError, match="'bad name' is not a valid Triton model name"):
        ensemble.export(tmp_path, "bad name")
    with pytest.raises(ExportError, match="either overwrite=True or add_version=True"):
        ensemble.export(tmp_path, "reco", overwrite=True, add_version=True)


def test_exported_python_step_reproduces_the_in_process_result(toy_workflow, toy_model, tmp_path):
    fused = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python"),
        toy_workflow.input_schema,
    )
    result = fused.export(tmp_path, "reco")
    step = HostedStep.load(str(tmp_path / result.models[0] / "1"))
    rows = toy_session.interactions(9, seed=11)
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])

    served = step.run(wire.to_wire(request))
    local = wire.to_wire(fused.run(request))

    assert sorted(served) == sorted(local)
    for name in local:
        np.testing.assert_array_equal(served[name], local[name])
