"""Export to an fsspec URL, here on fsspec's in-memory filesystem.

s3:// runs in the integration tests.
"""

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from merlin_torch_serving import Ensemble, ExportError
from tests import toy_session


@pytest.fixture
def ensemble(toy_workflow, toy_model):
    return Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, k=3), toy_workflow.input_schema
    )


@pytest.fixture
def memory_fs():
    fs = fsspec.filesystem("memory")
    yield fs
    if fs.exists("/exports"):
        fs.rm("/exports", recursive=True)


def test_the_ensemble_config_is_uploaded_after_every_other_file(ensemble, memory_fs, monkeypatch):
    uploaded = []
    original = MemoryFileSystem.put_file

    def recording_put(self, local, remote, *args, **kwargs):
        uploaded.append(remote)
        return original(self, local, remote, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "put_file", recording_put)
    result = ensemble.export("memory://exports/order", "reco")
    assert uploaded[-1].endswith("reco/config.pbtxt")
    step = result.models[0]
    step_files = [i for i, path in enumerate(uploaded) if f"/{step}/" in path]
    assert uploaded[step_files[-1]].endswith(f"{step}/config.pbtxt"), (
        "a model's config goes up after its files"
    )


def test_a_failed_upload_publishes_no_ensemble(ensemble, memory_fs, monkeypatch):
    original = MemoryFileSystem.put_file

    def failing_put(self, local, remote, *args, **kwargs):
        if remote.endswith("step.json"):
            raise OSError("connection reset")
        return original(self, local, remote, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "put_file", failing_put)
    with pytest.raises(
        ExportError,
        match=(
            r"uploading the repository to 'memory://exports/failed' failed: connection reset.*not"
            r" published"
        ),
    ):
        ensemble.export("memory://exports/failed", "reco")
    assert not memory_fs.exists("/exports/failed/reco/config.pbtxt")


def test_storage_options_are_refused_for_a_local_folder(ensemble, tmp_path):
    with pytest.raises(ValueError, match="storage_options are for URLs"):
        ensemble.export(tmp_path, "reco", storage_options={"key": "x"})


def test_a_file_url_exports_to_the_local_folder(ensemble, tmp_path):
    result = ensemble.export(f"file://{tmp_path}/repo", "reco")
    assert (tmp_path / "repo" / "reco" / "config.pbtxt").is_file()
    assert result.path == str(tmp_path / "repo")
