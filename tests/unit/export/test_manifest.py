"""Every exported file has its sha256 recorded; a step whose files changed refuses to load."""

import json

import numpy as np
import pytest
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import (
    ArtifactError,
    CategoryVocabulary,
    DecodeItemIds,
    Ensemble,
    ExportError,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.export.manifest import STEP_FORMAT_VERSION, sha256_of, verify_export
from merlin_torch_serving.export.python_model import HostedStep
from tests import toy_session


@pytest.fixture(scope="module")
def exported(toy_workflow, toy_model, tmp_path_factory):
    repository = tmp_path_factory.mktemp("manifest")
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="pytorch"),
        toy_workflow.input_schema,
    )
    ensemble.export(repository, "reco")
    return repository


def test_manifest_records_the_library_version_and_a_digest_of_every_step_file(exported):
    manifest = json.loads((exported / "reco" / "1" / "manifest.json").read_text())
    assert manifest["library_version"] == "0.1.0"
    assert manifest["format_version"] == STEP_FORMAT_VERSION
    libtorch = manifest["steps"][1]
    assert libtorch["artifacts"] == {
        "model.pt": sha256_of(exported / "reco-1-predictpytorch_topk" / "1" / "model.pt")
    }
    workflow_files = manifest["steps"][0]["artifacts"]
    assert {"model.py", "step.json", "ops/0/workflow/workflow.pkl"} <= set(workflow_files)
    verify_export(exported, "reco")


def test_a_step_refuses_to_load_a_file_changed_after_the_export(exported, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    step_dir = copy / "reco-0-transformworkflow" / "1"
    HostedStep.load(str(step_dir))  # as exported, it loads
    with open(step_dir / "ops" / "0" / "workflow" / "workflow.pkl", "ab") as file:
        file.write(b"tampered")
    with pytest.raises(
        ArtifactError,
        match=(
            r"step 'reco-0-transformworkflow' cannot be loaded: its file .*workflow\.pkl' has"
            r" sha256 .* not the .* recorded at export"
        ),
    ):
        HostedStep.load(str(step_dir))


def test_verify_export_finds_a_missing_libtorch_model(exported, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    (copy / "reco-1-predictpytorch_topk" / "1" / "model.pt").unlink()
    with pytest.raises(
        ArtifactError,
        match=(
            r"step 'reco-1-predictpytorch_topk' cannot be loaded: its file .*model\.pt' is missing"
        ),
    ):
        verify_export(copy, "reco")


def test_a_step_in_another_format_refuses_to_load_naming_both_versions(exported, tmp_path):
    import shutil

    step_dir = tmp_path / "reco-0-transformworkflow" / "1"
    shutil.copytree(exported / "reco-0-transformworkflow" / "1", step_dir)
    spec = json.loads((step_dir / "step.json").read_text())
    spec.update(format_version=STEP_FORMAT_VERSION + 1, library_version="9.0.0")
    (step_dir / "step.json").write_text(json.dumps(spec))
    with pytest.raises(
        ArtifactError,
        match=(
            rf"exported by merlin-torch-serving 9\.0\.0 in step format {STEP_FORMAT_VERSION + 1},"
            r" and this is 0\.1\.0.*re-export"
        ),
    ):
        HostedStep.load(str(step_dir))


def test_a_manifest_in_another_format_is_refused_by_verify_export(exported, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    manifest_path = copy / "reco" / "1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(format_version=STEP_FORMAT_VERSION - 1, library_version="0.0.9")
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(
        ArtifactError,
        match=(
            r"ensemble 'reco' cannot be loaded: it was exported by merlin-torch-serving 0\.0\.9 in"
            rf" step format {STEP_FORMAT_VERSION - 1}, and this is 0\.1\.0"
        ),
    ):
        verify_export(copy, "reco")


def test_an_operator_saved_in_another_format_of_its_own_refuses_to_load_naming_it(
    exported, tmp_path
):
    import shutil

    step_dir = tmp_path / "reco-0-transformworkflow" / "1"
    shutil.copytree(exported / "reco-0-transformworkflow" / "1", step_dir)
    spec = json.loads((step_dir / "step.json").read_text())
    assert spec["calls"][0]["format_version"] == TransformWorkflow.format_version
    spec["calls"][0]["format_version"] = TransformWorkflow.format_version + 1
    (step_dir / "step.json").write_text(json.dumps(spec))
    with pytest.raises(
        ArtifactError,
        match=(
            rf"step 'reco-0-transformworkflow' cannot be loaded: its operator TransformWorkflow was"
            rf" saved in format "
            rf"{TransformWorkflow.format_version + 1} of"
            r" merlin_torch_serving\.ops\.workflow\.TransformWorkflow, and that "
            rf"class reads format {TransformWorkflow.format_version}; re-export"
        ),
    ):
        HostedStep.load(str(step_dir))


def test_string_vocabularies_are_saved_and_loaded_without_pickle(tmp_path):
    raw = np.array([None, None, None, "apple", "pear"], dtype=object)
    vocabulary = CategoryVocabulary("item_id", raw, np.array([False, False, False, True, True]))
    schema = Schema([ColumnSchema("scores", dtype="float32", dims=(None, 5))])
    ensemble = Ensemble(
        ["scores"] >> TopK(2, exclude_ids=[0, 1, 2]) >> DecodeItemIds(vocabulary), schema
    )
    result = ensemble.export(tmp_path, "fruit")
    with np.load(
        tmp_path / result.models[0] / "1" / "ops" / "1" / "vocabulary.npz", allow_pickle=False
    ) as saved:
        assert saved["raw_values"].dtype.kind == "U"
    step = HostedStep.load(str(tmp_path / result.models[0] / "1"))
    answer = step.run({"scores": np.array([[9, 9, 9, 0.5, 0.7]], dtype=np.float32)})
    assert answer["item_ids"].tolist() == [["pear", "apple"]]
    assert step.calls[1].op.vocabulary.decode(np.array([0, 4])).tolist() == [None, "pear"]


class Unsaveable(TopK):
    def save_artifacts(self, artifact_path=None):
        raise PermissionError(13, "Permission denied", artifact_path)


def test_every_export_failure_is_an_export_error_with_the_cause_chained(tmp_path):
    schema = Schema([ColumnSchema("scores", dtype="float32", dims=(None, 5))])
    with pytest.raises(
        ExportError,
        match=(
            r"exporting ensemble 'e' to .* failed while writing step 'e-0-unsaveable'"
            r" \(TopK\(k=2\)\): PermissionError"
        ),
    ) as caught:
        Ensemble(["scores"] >> Unsaveable(2), schema).export(tmp_path / "repo", "e")
    assert isinstance(caught.value.__cause__, PermissionError)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(
        ExportError,
        match=r"failed while preparing the staging folder: (NotADirectoryError|FileExistsError)",
    ) as caught:
        Ensemble(["scores"] >> TopK(2), schema).export(tmp_path / "a_file" / "repo", "e")
    assert isinstance(caught.value.__cause__, OSError)
