"""A git host on disk laid out as upstream's (``triton-inference-server/<name>.git`` tagged at a
release, ``Tencent/rapidjson.git`` on its branch), made from release source folders, so the build's
clone path runs without the network through ``file://`` URLs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from merlin_torch_serving.backends import pytorch_sources

TRITON_REPOSITORIES = ("pytorch_backend", "backend", "core", "common")


def git(*arguments: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=build", "-c", "user.email=build@localhost", *arguments],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def repository_of(
    folder: Path, repository: Path, *, tag: str | None, branch: str, ignore=None
) -> None:
    """``repository``: one commit of ``folder``'s files on ``branch``, tagged ``tag``."""
    shutil.copytree(folder, repository, ignore=ignore)
    git("init", "--quiet", "--initial-branch", branch, cwd=repository)
    git("add", "--all", cwd=repository)
    git("commit", "--quiet", "--message", f"{folder.name} sources", cwd=repository)
    if tag is not None:
        git("tag", tag, cwd=repository)


def make_git_host(source_root: Path, host: Path, release: str) -> str:
    """Repositories of ``source_root``'s folders under ``host``; the host's ``file://`` URL."""
    for name in TRITON_REPOSITORIES:
        repository_of(
            source_root / name,
            host / "triton-inference-server" / f"{name}.git",
            tag=release,
            branch="main",
        )
    repository_of(
        source_root / "rapidjson",
        host / "Tencent" / "rapidjson.git",
        tag=None,
        branch=pytorch_sources.RAPIDJSON_BRANCH,
        # as in RapidJSON's repository: headers, no installed CMake config
        ignore=shutil.ignore_patterns("lib"),
    )
    return host.resolve().as_uri()
