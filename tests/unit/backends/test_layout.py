"""The backend folder laid out for the bundled tritonserver: the python backend, and the pytorch
backend beside it once one is built for this torch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from merlin_torch_serving.backends import (
    bundle,
    bundled_backend_directory,
    python_backend_directory,
)
from merlin_torch_serving.backends.pytorch_build import TorchInstall, build_folder
from merlin_torch_serving.exceptions import ServerError


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(bundle.CACHE_ENV_VAR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def stand_in_build(cache: Path) -> Path:
    """A file where a build of the pytorch backend for this torch and the bundled server goes."""
    version = bundle.tritonserver_version(bundle.bundled_tritonserver())
    folder = build_folder(version, TorchInstall.running().version, cache / "builds")
    folder.mkdir(parents=True)
    (folder / "libtriton_pytorch.so").write_bytes(b"stand-in for the built library")
    return folder / "libtriton_pytorch.so"


def test_python_backend_directory_lays_out_the_backend_once_and_reuses_it(tmp_path):
    first = python_backend_directory(cache_dir=tmp_path)
    assert sorted(path.name for path in (first / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    assert os.access(first / "python" / "triton_python_backend_stub", os.X_OK)
    assert python_backend_directory(cache_dir=tmp_path) == first
    assert [path.name for path in tmp_path.iterdir()] == [first.name], (
        "no staging folder may be left behind"
    )


def test_python_backend_directory_names_the_available_stubs_when_none_fits_the_python(tmp_path):
    # nvidia-pytriton ships stubs for Python 3.8 to 3.13; 3.7 has none.
    with pytest.raises(
        ServerError,
        match=r"no python-backend stub for Python '3\.7' \(it has stubs for Python 3\.8, .*3\.11",
    ):
        python_backend_directory(python_version="3.7", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_without_a_build_the_bundled_server_gets_the_python_backend_alone(empty_cache):
    folder = bundled_backend_directory()
    assert folder == python_backend_directory()
    assert sorted(path.name for path in folder.iterdir()) == ["python"]


def test_with_a_build_the_pytorch_backend_is_laid_out_beside_the_python_backend(empty_cache):
    library = stand_in_build(empty_cache)

    folder = bundled_backend_directory()

    assert sorted(path.name for path in folder.iterdir()) == ["python", "pytorch"]
    pytorch = folder / "pytorch"
    # copied, not linked: the loader looks for its dependencies beside the file it opened ($ORIGIN)
    assert not (pytorch / "libtriton_pytorch.so").is_symlink()
    assert (pytorch / "libtriton_pytorch.so").read_bytes() == library.read_bytes()
    assert (pytorch / "libtritonserver.so").resolve() == bundle.libtritonserver().resolve()
    torch_lib = Path(torch.__file__).parent / "lib"
    for entry in torch_lib.iterdir():
        if entry.is_file():
            assert (pytorch / entry.name).resolve() == entry.resolve(), entry.name
    assert (folder / "python" / "triton_python_backend_stub").is_file()
    assert bundled_backend_directory() == folder
    assert [path.name for path in folder.parent.iterdir() if path.name.startswith(".")] == [], (
        "no staging folder left"
    )
