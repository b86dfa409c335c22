"""The tools a build of the pytorch backend needs (cmake, ninja or make, a C++ compiler, and git
when it clones its sources), found on this machine or named with how to install them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from merlin_torch_serving.exceptions import BackendBuildError

#: the command that builds the backend, for messages
BUILD_COMMAND = "merlin-torch-serving build-backend pytorch"
_MIN_CMAKE = (3, 18)


@dataclass(frozen=True)
class BuildTools:
    cmake: str
    generator: str
    compiler: str


def build_tools(cloning: bool) -> BuildTools:
    """cmake (3.18 or newer), ninja or make, a C++ compiler, and git when ``cloning``.

    What is missing gets a clear error.
    """
    missing = []
    if cloning and shutil.which("git") is None:
        missing.append("git, to clone the sources (apt-get install git), or pass --sources")
    cmake = shutil.which("cmake")
    if cmake is None:
        missing.append("cmake 3.18 or newer (apt-get install cmake, or pip install cmake)")
    else:
        version = _cmake_version(cmake)
        if version is not None and version < _MIN_CMAKE:
            missing.append(f"cmake 3.18 or newer (found {'.'.join(map(str, version))} at {cmake})")
    generator = (
        "Ninja" if shutil.which("ninja") else "Unix Makefiles" if shutil.which("make") else None
    )
    if generator is None:
        missing.append("ninja or make (apt-get install ninja-build, or pip install ninja)")
    compiler = (
        os.environ.get("CXX")
        or shutil.which("g++")
        or shutil.which("c++")
        or shutil.which("clang++")
    )
    if compiler is None:
        missing.append("a C++ compiler (apt-get install g++), or set CXX to one")
    if missing or cmake is None or generator is None or compiler is None:
        raise BackendBuildError(
            f"cannot build the pytorch backend: this machine lacks {'; '.join(missing)}. Install "
            f"{'it' if len(missing) == 1 else 'them'} and run `{BUILD_COMMAND}` again"
        )
    return BuildTools(cmake, generator, compiler)


def _cmake_version(cmake: str) -> tuple[int, ...] | None:
    try:
        text = subprocess.run(
            [cmake, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None
