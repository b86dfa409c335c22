"""The build's clone path, against git hosts on disk reached through ``file://`` URLs: a stand-in
release that records what cmake was given, the real release sources (cloned at their tag, then
CMake's configure step, which clones common, core and backend itself), and set-up going on
without the backend, saying so, where neither the network nor MTS_PYTORCH_BACKEND_SOURCES gives
the sources. The full compile from a clone is not repeated here: it is the one the offline tests
already compile, from the same files."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from merlin_torch_serving import cli
from merlin_torch_serving.backends import bundle, pytorch_sources
from merlin_torch_serving.backends.pytorch_build import (
    TorchInstall,
    build_folder,
    build_tools,
    configure,
    prepared_sources,
)

from .local_git_host import make_git_host
from .stand_in import release_sources, write_changed_file

ROOT = Path(__file__).resolve().parents[3]

# Writes what the build was given into the "library", after finding RapidJSON as common does.
RECORDING_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(stand_in LANGUAGES NONE)
find_package(RapidJSON CONFIG REQUIRED)
file(WRITE ${CMAKE_BINARY_DIR}/libtriton_pytorch.so
  "organization=${TRITON_REPO_ORGANIZATION};core_tag=${TRITON_CORE_REPO_TAG};rapidjson=${RAPIDJSON_INCLUDE_DIRS};offline=${FETCHCONTENT_FULLY_DISCONNECTED}")
add_custom_target(triton-pytorch-backend COMMAND ${CMAKE_COMMAND} -E true)
"""


def server_version() -> str:
    return bundle.tritonserver_version(bundle.bundled_tritonserver())


def release() -> str:
    return bundle.release_of(server_version())


@pytest.fixture
def stand_in_host(tmp_path) -> str:
    """A host whose pytorch_backend records its options and whose RapidJSON has headers only."""
    sources = tmp_path / "stand-in"
    for name in pytorch_sources.SOURCE_FOLDERS:
        (sources / name).mkdir(parents=True)
        (sources / name / "README").write_text(name)
    (sources / "pytorch_backend" / "CMakeLists.txt").write_text(RECORDING_CMAKELISTS)
    write_changed_file(sources / "pytorch_backend")
    (sources / "rapidjson" / "include" / "rapidjson").mkdir(parents=True)
    (sources / "rapidjson" / "include" / "rapidjson" / "rapidjson.h").write_text("")
    return make_git_host(sources, tmp_path / "host", release())


@pytest.fixture(scope="module")
def release_host(tmp_path_factory) -> str:
    """A host made from the release tarball, its repositories tagged at the release."""
    folder = tmp_path_factory.mktemp("release")
    with tarfile.open(release_sources()) as archive:
        archive.extractall(folder / "sources", filter="data")
    return make_git_host(folder / "sources", folder / "host", release())


def test_without_sources_the_command_clones_the_release_from_the_git_host_and_builds_from_it(
    tmp_path, monkeypatch, capsys, stand_in_host
):
    monkeypatch.setenv(bundle.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setenv(pytorch_sources.GIT_HOST_ENV_VAR, stand_in_host)

    assert cli.main(["build-backend", "pytorch", "--skip-if-unreachable"]) == 0

    output = capsys.readouterr().out
    assert f"cloning pytorch_backend {release()} and RapidJSON from {stand_in_host}" in output
    assert "(built now)" in output
    folder = build_folder(
        server_version(), TorchInstall.running().version, tmp_path / "cache" / "builds"
    )
    recorded = dict(
        item.split("=", 1) for item in (folder / "libtriton_pytorch.so").read_text().split(";")
    )
    assert recorded["organization"] == f"{stand_in_host}/triton-inference-server"
    assert recorded["core_tag"] == release()
    assert recorded["offline"] == ""  # CMake fetches common, core and backend at the release
    assert recorded["rapidjson"].endswith("/sources/rapidjson/include")
    record = json.loads((folder / "build.json").read_text())
    assert record["sources"] == (
        f"{stand_in_host}/triton-inference-server/pytorch_backend.git@{release()}"
    )


def test_the_release_clones_and_configures_as_the_build_expects(tmp_path, release_host):
    lines: list[str] = []
    log = tmp_path / "build.log"

    root, options, origin = prepared_sources(
        None, server_version(), tmp_path / "sources", log, lines.append, git_host=release_host
    )
    configure(
        build_tools(cloning=True),
        TorchInstall.running(),
        root,
        options,
        tmp_path / "build",
        log,
        lines.append,
    )

    assert sorted(path.name for path in root.iterdir()) == ["pytorch_backend", "rapidjson"]
    assert (root / "rapidjson" / "include" / "rapidjson" / "document.h").is_file()
    assert origin == f"{release_host}/triton-inference-server/pytorch_backend.git@{release()}"
    # CMake cloned the other three at the release, from the same host
    for name in ("common", "core", "backend"):
        assert (tmp_path / "build" / "_deps" / f"repo-{name}-src" / "CMakeLists.txt").is_file()
    output = log.read_text()
    assert f"RapidJSON found. Headers: {root / 'rapidjson' / 'include'}" in output
    assert (tmp_path / "build" / "build.ninja").is_file() or (
        tmp_path / "build" / "Makefile"
    ).is_file()


def test_a_host_without_the_release_tag_or_unreachable_is_named(tmp_path, release_host):
    assert pytorch_sources.unreachable(release_host, release()) is None
    assert pytorch_sources.unreachable(release_host, "r00.01") == (
        f"{release_host}/triton-inference-server/pytorch_backend.git has no tag r00.01"
    )
    nowhere = (tmp_path / "nowhere").as_uri()
    reason = pytorch_sources.unreachable(nowhere, release())
    assert reason is not None
    assert reason.startswith(
        f"git could not reach {nowhere}/triton-inference-server/pytorch_backend.git (fatal: "
    )


def test_without_git_the_sources_cannot_be_cloned(tmp_path, monkeypatch, release_host):
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    assert pytorch_sources.unreachable(release_host, release()) == (
        "git is not installed (apt-get install git)"
    )


def test_set_up_without_the_variable_or_a_reachable_host_goes_on_without_the_backend_saying_so(
    tmp_path,
):
    nowhere = (tmp_path / "nowhere").as_uri()
    environment = {
        key: value for key, value in os.environ.items() if key != "MTS_PYTORCH_BACKEND_SOURCES"
    }
    environment |= {
        bundle.CACHE_ENV_VAR: str(tmp_path / "cache"),
        pytorch_sources.GIT_HOST_ENV_VAR: nowhere,
    }

    finished = subprocess.run(
        ["bash", str(ROOT / "run"), "setup"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert finished.returncode == 0, finished.stderr
    assert (
        "not building the pytorch backend: its sources cannot be cloned: git could not reach"
        f" {nowhere}/triton-inference-server/pytorch_backend.git"
    ) in finished.stderr
    assert "going on without Triton's pytorch (libtorch) backend" in finished.stderr
    assert not (tmp_path / "cache" / "builds").exists() or not any(
        (tmp_path / "cache" / "builds").iterdir()
    ), "nothing was built"
