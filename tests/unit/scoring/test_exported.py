"""An exported ensemble loaded and run in this process, from its repository's files only: the
same answers as the in-process graph, bit for bit, in every form an export takes (all python, a
libtorch model step, batched or not); files changed after the export are refused."""

from __future__ import annotations

import pandas as pd
import pytest

from merlin_torch_serving import ArtifactError, Ensemble, ModelOptions
from merlin_torch_serving.data import frames
from merlin_torch_serving.scoring.exported import ExportedEnsemble, read_export
from tests import scoring_data, toy_session


@pytest.fixture(scope="module")
def graph(filtered_toy_workflow):
    model = toy_session.scripted_model(filtered_toy_workflow)
    return lambda backend: Ensemble(
        toy_session.session_graph(filtered_toy_workflow, model, backend),
        filtered_toy_workflow.input_schema,
    )


@pytest.fixture(scope="module")
def exported(graph, tmp_path_factory):
    """backend -> (ensemble, repository) exported without batching."""
    found = {}
    for backend in ("python", "pytorch"):
        ensemble = graph(backend)
        repository = tmp_path_factory.mktemp(f"exported_{backend}")
        ensemble.export(repository, "reco")
        found[backend] = (ensemble, repository)
    return found


@pytest.mark.parametrize("backend", ["python", "pytorch"])
@pytest.mark.parametrize("batching", [False, True])
def test_exported_ensemble_answers_as_the_in_process_graph_bit_for_bit(
    graph, backend, batching, tmp_path
):
    ensemble = graph(backend)
    ensemble.export(tmp_path, "reco", options=ModelOptions(batching=batching))
    rows = scoring_data.clicks()

    loaded = ExportedEnsemble(tmp_path)
    answer = frames.table_to_frame(loaded.run(frames.frame_to_table(rows, loaded.input_schema)))

    expected = ensemble.transform(rows)
    pd.testing.assert_frame_equal(answer, expected, check_exact=True)
    assert answer["filtered_out"].any()  # one-click sessions are answered, marked


def test_a_changed_model_file_is_refused(exported, tmp_path):
    import shutil

    _, repository = exported["pytorch"]
    copy = tmp_path / "repository"
    shutil.copytree(repository, copy)
    [model_file] = copy.glob("reco-1-*/1/model.pt")
    model_file.write_bytes(model_file.read_bytes() + b"\0")

    with pytest.raises(ArtifactError, match=r"model\.pt' has sha256 .* changed or replaced"):
        ExportedEnsemble(copy)


def test_the_digest_names_the_export_and_changes_with_any_config(exported, tmp_path):
    import shutil

    _, repository = exported["python"]
    copy = tmp_path / "repository"
    shutil.copytree(repository, copy)
    assert read_export(copy).digest == read_export(repository).digest  # the path does not count

    [config] = copy.glob("reco-0-*/config.pbtxt")
    config.write_text(config.read_text().replace('string_value: "1"', 'string_value: "2"', 1))

    assert read_export(copy).digest != read_export(repository).digest


def test_the_ensemble_must_be_named_when_the_repository_holds_several(exported, graph, tmp_path):
    import shutil

    _, repository = exported["python"]
    shutil.copytree(repository, tmp_path, dirs_exist_ok=True)
    graph("python").export(tmp_path, "other")

    with pytest.raises(ArtifactError, match=r"holds 2 ensembles \('other', 'reco'\); name the one"):
        read_export(tmp_path)
    assert read_export(tmp_path, "other").name == "other"
    with pytest.raises(ArtifactError, match="holds no ensemble exported by merlin-torch-serving"):
        read_export(tmp_path / "reco-0-transformworkflow_predictpytorch_topk_blankfilteredrows")
    with pytest.raises(ArtifactError, match=r"repository '.*elsewhere' cannot be loaded: no such"):
        read_export(tmp_path / "elsewhere")
