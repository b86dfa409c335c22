"""The project's change to Triton's pytorch backend: it applies to the release sources (to a copy:
the sources given stay as they are), sources of another release are refused naming where they
differ, and the build cache tells a build with the change (as it is now) from any other."""

from __future__ import annotations

import tarfile

import pytest

from merlin_torch_serving.backends import bundle, pytorch_change
from merlin_torch_serving.backends.pytorch_build import (
    BACKEND_LIBRARY,
    TorchInstall,
    build_folder,
    built_pytorch_backend,
)
from merlin_torch_serving.exceptions import BackendBuildError

from .stand_in import release_sources


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    folder = tmp_path_factory.mktemp("release")
    with tarfile.open(release_sources()) as archive:
        archive.extractall(folder, filter="data")
    return folder


def test_the_change_applies_to_a_copy_of_the_release_sources(release, tmp_path):
    upstream = (release / "pytorch_backend" / "src" / "libtorch.cc").read_text()

    changed = pytorch_change.changed_backend(release, tmp_path)

    assert changed == tmp_path / "pytorch_backend"
    text = (changed / "src" / "libtorch.cc").read_text()
    assert "torch::inductor::AOTIModelPackageLoader" in text
    assert "ModelInstanceState::ValidatePackageInputs()" in text
    assert "torch::jit::load(model_stream, device)" in text, "TorchScript is still served"
    assert (release / "pytorch_backend" / "src" / "libtorch.cc").read_text() == upstream
    assert (changed / "CMakeLists.txt").read_text() == (
        release / "pytorch_backend" / "CMakeLists.txt"
    ).read_text()


def test_sources_of_another_release_are_refused_naming_the_file_and_the_place(release, tmp_path):
    other = tmp_path / "other"
    (other / "pytorch_backend" / "src").mkdir(parents=True)
    upstream = (release / "pytorch_backend" / "src" / "libtorch.cc").read_text()
    (other / "pytorch_backend" / "src" / "libtorch.cc").write_text(
        upstream.replace("#include <ATen/Parallel.h>", "#include <ATen/Parallel.h> // moved")
    )

    with pytest.raises(
        BackendBuildError,
        match=(
            r"pytorch_backend/src/libtorch\.cc differs from the release it was made for near its"
            r" line 61 .* build from the sources of the release matching the bundled tritonserver"
        ),
    ):
        pytorch_change.changed_backend(other, tmp_path / "changed")


def test_a_build_without_the_change_is_not_taken_for_one_with_it(tmp_path):
    server = bundle.tritonserver_version(bundle.bundled_tritonserver())
    torch_version = TorchInstall.running().version
    with_change = build_folder(server, torch_version, tmp_path)
    without = tmp_path / f"libtriton_pytorch-tritonserver-{server}-torch-{torch_version}"
    without.mkdir()
    (without / BACKEND_LIBRARY).write_bytes(b"a build of upstream's sources")

    assert with_change.name == f"{without.name}-change-{pytorch_change.change_id()}"
    assert built_pytorch_backend(server, torch_version, tmp_path) is None


def test_another_version_of_the_change_is_another_build(tmp_path, monkeypatch):
    server = bundle.tritonserver_version(bundle.bundled_tritonserver())
    torch_version = TorchInstall.running().version
    now = build_folder(server, torch_version, tmp_path)
    edited = tmp_path / "edited.patch"
    edited.write_text(pytorch_change.PATCH_FILE.read_text() + "\n")
    monkeypatch.setattr(pytorch_change, "PATCH_FILE", edited)
    pytorch_change.change_id.cache_clear()
    try:
        assert build_folder(server, torch_version, tmp_path) != now
    finally:
        monkeypatch.undo()
        pytorch_change.change_id.cache_clear()
    assert build_folder(server, torch_version, tmp_path) == now
