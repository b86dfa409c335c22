"""Building the pytorch backend: the cmake pipeline run on stand-in sources (a CMakeLists.txt that
records what it was given instead of compiling the backend), the cache, and every failure a user
can meet. The real build runs in `./run setup` (see README)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from merlin_torch_serving import cli
from merlin_torch_serving.backends import bundle, pytorch_change
from merlin_torch_serving.backends.pytorch_build import (
    TorchInstall,
    build_folder,
    build_pytorch_backend,
)
from merlin_torch_serving.backends.pytorch_sources import SOURCE_FOLDERS
from merlin_torch_serving.exceptions import BackendBuildError

from .stand_in import write_changed_file

# Writes the options the build passes into the "library", so the test can read them back.
RECORDING_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(stand_in LANGUAGES NONE)
file(WRITE ${CMAKE_BINARY_DIR}/libtriton_pytorch.so
  "gpu=${TRITON_ENABLE_GPU};torch_lib=${TRITON_PYTORCH_LIB_PATHS};core=${FETCHCONTENT_SOURCE_DIR_REPO-CORE};offline=${FETCHCONTENT_FULLY_DISCONNECTED}")
add_custom_target(triton-pytorch-backend COMMAND ${CMAKE_COMMAND} -E true)
"""
BROKEN_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(broken LANGUAGES NONE)
message(FATAL_ERROR "broken on purpose")
"""


def write_sources(root: Path, cmakelists: str) -> Path:
    for name in SOURCE_FOLDERS:
        (root / name).mkdir(parents=True)
    (root / "pytorch_backend" / "CMakeLists.txt").write_text(cmakelists)
    write_changed_file(root / "pytorch_backend")
    return root


def as_tarball(folder: Path, path: Path) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for entry in folder.iterdir():
            archive.add(entry, arcname=f"./{entry.name}")
    return path


def server_version() -> str:
    return bundle.tritonserver_version(bundle.bundled_tritonserver())


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tarball"])
def test_build_runs_cmake_offline_on_the_sources_reports_progress_and_caches_the_library(
    tmp_path, packed
):
    sources = write_sources(tmp_path / "sources", RECORDING_CMAKELISTS)
    if packed:
        sources = as_tarball(sources, tmp_path / "sources.tar.gz")
    lines: list[str] = []

    built = build_pytorch_backend(
        sources=sources, cache_dir=tmp_path / "cache", progress=lines.append
    )

    torch = TorchInstall.running()
    assert built.built_now
    assert built.folder == build_folder(server_version(), torch.version, tmp_path / "cache")
    recorded = dict(item.split("=", 1) for item in built.library.read_text().split(";"))
    assert recorded["gpu"] == "OFF"
    assert recorded["offline"] == "ON"
    assert recorded["torch_lib"] == str(torch.lib)
    assert recorded["core"].endswith("/core")
    record = json.loads((built.folder / "build.json").read_text())
    assert record["torch_version"] == torch.version
    assert record["tritonserver_version"] == server_version()
    assert record["sources"] == str(sources.resolve())
    assert record["change_id"] == pytorch_change.change_id()
    assert any(line.startswith("configuring with cmake") for line in lines)
    assert any(line.strip().startswith("[1/") for line in lines), lines  # one line per build step
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [built.folder.name], (
        "no staging folder left"
    )


def test_a_second_build_for_the_same_torch_returns_the_cached_library_without_tools_or_sources(
    tmp_path, monkeypatch
):
    built = build_pytorch_backend(
        sources=write_sources(tmp_path / "sources", RECORDING_CMAKELISTS),
        cache_dir=tmp_path / "cache",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))

    again = build_pytorch_backend(
        sources=tmp_path / "gone", cache_dir=tmp_path / "cache", progress=pytest.fail
    )

    assert not again.built_now
    assert again.library == built.library


def test_missing_build_tools_are_named_with_how_to_install_them(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(BackendBuildError) as caught:
        build_pytorch_backend(cache_dir=tmp_path / "cache")  # no sources: they would be cloned
    message = str(caught.value)
    assert "git, to clone the sources (apt-get install git), or pass --sources" in message
    assert "this machine lacks git, to clone" in message
    assert "cmake 3.18 or newer (apt-get install cmake, or pip install cmake)" in message
    assert "ninja or make (apt-get install ninja-build, or pip install ninja)" in message
    assert "a C++ compiler (apt-get install g++), or set CXX to one" in message
    assert "run `merlin-torch-serving build-backend pytorch` again" in message


def test_sources_that_do_not_exist_are_named(tmp_path):
    with pytest.raises(
        BackendBuildError,
        match=r"sources '.*nowhere\.tar\.gz' do not exist; pass a \.tar\.gz or a folder",
    ):
        build_pytorch_backend(sources=tmp_path / "nowhere.tar.gz", cache_dir=tmp_path / "cache")


def test_sources_without_the_five_folders_name_the_missing_ones(tmp_path):
    (tmp_path / "sources" / "pytorch_backend").mkdir(parents=True)
    with pytest.raises(
        BackendBuildError,
        match=(
            r"lack the folder\(s\) backend, core, common, rapidjson: expected .* found"
            r" pytorch_backend"
        ),
    ):
        build_pytorch_backend(sources=tmp_path / "sources", cache_dir=tmp_path / "cache")


def test_a_failing_cmake_step_raises_with_the_end_of_its_output_and_keeps_the_log(tmp_path):
    sources = write_sources(tmp_path / "sources", BROKEN_CMAKELISTS)
    with pytest.raises(BackendBuildError) as caught:
        build_pytorch_backend(
            sources=sources, cache_dir=tmp_path / "cache", progress=lambda line: None
        )
    message = str(caught.value)
    assert "cmake configure failed (exit code 1); the last lines of its output:" in message
    assert "broken on purpose" in message
    kept = Path(message.rsplit("full build log: ", 1)[1])
    assert kept.is_file()
    assert "broken on purpose" in kept.read_text()
    assert sorted(path.name for path in (tmp_path / "cache").iterdir()) == [kept.name], (
        "nothing but the log is left"
    )


def test_the_command_builds_then_reports_the_cached_build(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(bundle.CACHE_ENV_VAR, str(tmp_path / "cache"))
    sources = write_sources(tmp_path / "sources", RECORDING_CMAKELISTS)

    assert cli.main(["build-backend", "pytorch", "--check"]) == 1
    assert "no pytorch backend is built for this torch" in capsys.readouterr().out
    assert cli.main(["build-backend", "pytorch", "--sources", str(sources)]) == 0
    built = capsys.readouterr().out
    assert cli.main(["build-backend", "pytorch"]) == 0
    cached = capsys.readouterr().out
    assert cli.main(["build-backend", "pytorch", "--check"]) == 0

    library = build_folder(
        server_version(), TorchInstall.running().version, tmp_path / "cache" / "builds"
    )
    assert f"(built now): {library / 'libtriton_pytorch.so'}" in built
    assert (
        cached.strip()
        == f"pytorch backend for torch {TorchInstall.running().version} and tritonserver"
        f" {server_version()} (already built): {library / 'libtriton_pytorch.so'}"
    )


def test_the_command_reports_a_failed_build_as_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(bundle.CACHE_ENV_VAR, str(tmp_path / "cache"))
    assert cli.main(["build-backend", "pytorch", "--sources", str(tmp_path / "nowhere")]) == 1
    assert "error: sources" in capsys.readouterr().err
