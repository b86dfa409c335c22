"""Where the pytorch backend's sources come from, and the CMake options that point a build there.

Either from a tarball or folder holding Triton's ``pytorch_backend``, ``backend``, ``core`` and
``common`` at one release and RapidJSON (the build then stays offline), or from git: shallow clones
of upstream's ``pytorch_backend`` at the release and of RapidJSON's headers, laid out as the
tarball's, with CMake fetching the other three at the same release. The git host is GitHub unless
``$MTS_PYTORCH_BACKEND_GIT_HOST`` names another laid out the same way (a mirror; ``file://``
URLs of local repositories work too).
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from merlin_torch_serving.exceptions import BackendBuildError

SOURCE_FOLDERS = ("pytorch_backend", "backend", "core", "common", "rapidjson")
#: a git host holding ``triton-inference-server/<name>.git`` and ``Tencent/rapidjson.git``
GIT_HOST_ENV_VAR = "MTS_PYTORCH_BACKEND_GIT_HOST"
DEFAULT_GIT_HOST = "https://github.com"
# RapidJSON is header-only, so its newest headers are taken; upstream's own builds take the
# system's (rapidjson-dev), which a fresh machine rarely has
RAPIDJSON_BRANCH = "master"
#: seconds a look at the git host may take before it counts as unreachable
REACH_TIMEOUT = 30
#: git never asks for a password: an unknown repository fails instead of waiting on a prompt
GIT_ENVIRONMENT = {"GIT_TERMINAL_PROMPT": "0"}

# where a RapidJSON install keeps its CMake config; common's CMakeLists asks
# find_package(RapidJSON) for its include folder only
RAPIDJSON_CONFIG_FOLDER = Path("lib", "cmake", "RapidJSON")
_RAPIDJSON_CONFIG = """\
set(RAPIDJSON_INCLUDE_DIRS "{include}")
set(RapidJSON_INCLUDE_DIRS "{include}")
"""


def git_host(host: str | None = None) -> str:
    """``host``, else ``$MTS_PYTORCH_BACKEND_GIT_HOST``, else GitHub; without a trailing slash."""
    return (host or os.environ.get(GIT_HOST_ENV_VAR) or DEFAULT_GIT_HOST).rstrip("/")


def triton_organization(host: str) -> str:
    """Where CMake fetches ``common``, ``core`` and ``backend`` from."""
    return f"{host}/triton-inference-server"


def pytorch_backend_repository(host: str) -> str:
    return f"{triton_organization(host)}/pytorch_backend.git"


def rapidjson_repository(host: str) -> str:
    return f"{host}/Tencent/rapidjson.git"


def clone_command(repository: str, ref: str, target: Path) -> list[str]:
    """git's command for a shallow clone of ``repository`` at the branch or tag ``ref``.

    A transfer that stalls for a minute fails rather than hanging the build.
    """
    return [
        "git",
        "-c",
        "http.lowSpeedLimit=1000",
        "-c",
        "http.lowSpeedTime=60",
        "clone",
        "--quiet",
        "--depth",
        "1",
        "--branch",
        ref,
        repository,
        str(target),
    ]


def unreachable(host: str, release: str, timeout: float = REACH_TIMEOUT) -> str | None:
    """Why ``release`` of pytorch_backend cannot be cloned from ``host``, or None when it can.

    Asks the host for the release's tag only, so it takes a second where the network answers
    and at most ``timeout`` where it drops the connection.
    """
    repository = pytorch_backend_repository(host)
    command = ["git", "ls-remote", "--exit-code", repository, f"refs/tags/{release}"]
    try:
        answer = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **GIT_ENVIRONMENT},
        )
    except FileNotFoundError:
        return "git is not installed (apt-get install git)"
    except subprocess.TimeoutExpired:
        return f"{repository} did not answer within {timeout:.0f} s"
    if answer.returncode == 2:  # --exit-code: the repository answered without the tag
        return f"{repository} has no tag {release}"
    if answer.returncode != 0:
        said = [line for line in answer.stderr.splitlines() if line.startswith("fatal:")]
        return f"git could not reach {repository} ({said[0] if said else answer.returncode})"
    return None


def lay_out_rapidjson(clone: Path) -> Path:
    """``clone``, a clone of RapidJSON's repository, with the CMake config an install of it has.

    The build then finds its headers as it finds the release sources'.
    """
    config = clone / RAPIDJSON_CONFIG_FOLDER / "RapidJSONConfig.cmake"
    if not config.is_file():
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(_RAPIDJSON_CONFIG.format(include=(clone / "include").as_posix()))
    return clone


def rapidjson_options(rapidjson: Path) -> list[str]:
    """The options that point the build at the RapidJSON in ``rapidjson`` (headers and config)."""
    return [
        f"-DCMAKE_CXX_FLAGS=-I{rapidjson / 'include'}",
        f"-DRapidJSON_DIR={rapidjson / RAPIDJSON_CONFIG_FOLDER}",
    ]


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
    return [
        *rapidjson_options(source_root / "rapidjson"),
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        *(
            f"-DFETCHCONTENT_SOURCE_DIR_REPO-{name.upper()}={source_root / name}"
            for name in ("common", "core", "backend")
        ),
    ]


def upstream_options(source_root: Path, release: str, host: str) -> list[str]:
    """FetchContent clones the three dependencies at ``release`` from ``host``, as upstream's
    build does; RapidJSON is the clone in ``source_root``."""
    return [
        *rapidjson_options(source_root / "rapidjson"),
        f"-DTRITON_REPO_ORGANIZATION={triton_organization(host)}",
        *(f"-DTRITON_{name}_REPO_TAG={release}" for name in ("COMMON", "CORE", "BACKEND")),
    ]
