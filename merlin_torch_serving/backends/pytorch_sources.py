"""Where the pytorch backend's sources come from, and the CMake options that point a build there.

Either from a tarball or folder holding Triton's ``pytorch_backend``, ``backend``, ``core`` and
``common`` at one release and RapidJSON (the build then stays offline), or from a shallow clone of
upstream's ``pytorch_backend``, with CMake fetching the other three at the same release.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from merlin_torch_serving.exceptions import BackendBuildError

SOURCE_FOLDERS = ("pytorch_backend", "backend", "core", "common", "rapidjson")


def clone_command(release: str, organization: str, destination: Path) -> list[str]:
    """git's command for a shallow clone of ``organization``'s pytorch_backend at ``release``."""
    repository = f"{organization}/pytorch_backend.git"
    target = str(destination / "pytorch_backend")
    return ["git", "clone", "--quiet", "--depth", "1", "--branch", release, repository, target]


def unpacked(sources: Path, destination: Path, progress) -> Path:
    """The folder with the five source folders: ``sources`` itself, or where its tarball unpacks."""
    if sources.is_dir():
        root = sources
    elif sources.is_file():
        progress(f"unpacking {sources}")
        try:
            with tarfile.open(sources) as archive:
                archive.extractall(destination, filter="data")
        except (tarfile.TarError, OSError) as error:
            raise BackendBuildError(
                f"could not unpack the sources {str(sources)!r}: {error}"
            ) from error
        root = destination
    else:
        raise BackendBuildError(
            f"sources {str(sources)!r} do not exist; pass a .tar.gz or a folder holding"
            f" {', '.join(SOURCE_FOLDERS)}, or leave --sources out to clone them (needs the"
            " network)"
        )
    missing = [name for name in SOURCE_FOLDERS if not (root / name).is_dir()]
    if missing:
        found = sorted(entry.name for entry in root.iterdir()) if root.is_dir() else []
        raise BackendBuildError(
            f"sources {str(sources)!r} lack the folder(s) {', '.join(missing)}: expected"
            f" {', '.join(SOURCE_FOLDERS)} (Triton's pytorch_backend, backend, core and common at"
            f" one release, and RapidJSON), found {', '.join(found) or 'nothing'}"
        )
    return root


def offline_options(source_root: Path) -> list[str]:
    """FetchContent takes the three dependencies from the sources and never goes online."""
    rapidjson = source_root / "rapidjson"
    return [
        f"-DCMAKE_CXX_FLAGS=-I{rapidjson / 'include'}",
        f"-DRapidJSON_DIR={rapidjson / 'lib' / 'cmake' / 'RapidJSON'}",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        *(
            f"-DFETCHCONTENT_SOURCE_DIR_REPO-{name.upper()}={source_root / name}"
            for name in ("common", "core", "backend")
        ),
    ]


def upstream_options(release: str, organization: str) -> list[str]:
    """FetchContent clones the three dependencies at ``release``, as upstream's build does."""
    return [
        f"-DTRITON_REPO_ORGANIZATION={organization}",
        *(f"-DTRITON_{name}_REPO_TAG={release}" for name in ("COMMON", "CORE", "BACKEND")),
    ]
