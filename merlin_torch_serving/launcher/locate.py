"""Which tritonserver runs, with which backend folder, in which environment.

By default it is the tritonserver bundled with nvidia-pytriton, with the backend folder that
``backends.layout`` lays out for this interpreter (the python backend, and the pytorch one once
built). Any other install keeps its own backends.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from merlin_torch_serving.backends.bundle import pytriton_libraries, pytriton_server_root
from merlin_torch_serving.backends.layout import bundled_backend_directory
from merlin_torch_serving.exceptions import ServerNotFoundError

BINARY_ENV_VAR = "MTS_TRITONSERVER"
#: scheduled by the server core, not by a backend library, so always available
CORE_BACKENDS = ("ensemble",)


def find_tritonserver(binary: str | os.PathLike | None = None) -> Path:
    """The tritonserver to run: ``binary``, else $MTS_TRITONSERVER, else PATH, else
    nvidia-pytriton's.

    An explicit choice that does not exist is an error rather than a reason to fall back, so a
    typo never silently runs another server.
    """
    if binary is not None:
        return _checked_binary(Path(binary), f"binary={os.fspath(binary)!r}")
    from_env = os.environ.get(BINARY_ENV_VAR)
    if from_env:
        return _checked_binary(Path(from_env), f"{BINARY_ENV_VAR}={from_env!r}")
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path)
    searched = ["`tritonserver` on PATH (not found)"]
    bundle = pytriton_server_root()
    if bundle is None:
        searched.append("the nvidia-pytriton package (not installed)")
    else:
        bundled = bundle / "bin" / "tritonserver"
        if _is_executable(bundled):
            return bundled
        searched.append(f"{str(bundled)!r} (missing or not executable)")
    raise ServerNotFoundError(searched)


def backend_directory(binary: Path) -> Path:
    """The backend folder for ``binary``: the one laid out for the bundled server, else the
    install's own ``backends/`` beside ``bin/`` (e.g. /opt/tritonserver/backends), whose python
    backend must not be swapped for the bundle's."""
    bundle = pytriton_server_root()
    if bundle is not None and binary.resolve().is_relative_to(bundle.resolve()):
        return bundled_backend_directory(binary)
    return binary.resolve().parent.parent / "backends"


def backends_in(directory: Path) -> list[str]:
    """The backends a server started with ``directory`` can run: its subfolders, plus the core's."""
    found = (
        [entry.name for entry in directory.iterdir() if entry.is_dir()]
        if directory.is_dir()
        else []
    )
    return sorted({*found, *CORE_BACKENDS})


def server_environment() -> dict[str, str]:
    """This process's environment, with what the python-backend stub needs to run as this Python."""
    environment = dict(os.environ)
    # The stub embeds CPython but ignores PYTHONPATH: it takes its prefix from the first python3 on
    # PATH, so this interpreter goes first and models import what this process imports.
    environment["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).parent), environment.get("PATH", os.defpath)]
    )
    # The copied backend's RPATH ($ORIGIN/...) no longer reaches the wheel's libraries, and the
    # stub links against this interpreter's libpython.
    libraries = []
    bundled_libraries = pytriton_libraries()
    if bundled_libraries is not None:
        libraries.append(str(bundled_libraries))
    if sysconfig.get_config_var("LIBDIR"):
        libraries.append(sysconfig.get_config_var("LIBDIR"))
    if environment.get("LD_LIBRARY_PATH"):
        libraries.append(environment["LD_LIBRARY_PATH"])
    environment["LD_LIBRARY_PATH"] = os.pathsep.join(libraries)
    return environment


def _checked_binary(path: Path, source: str) -> Path:
    if _is_executable(path):
        return path
    why = "not executable" if path.exists() else "does not exist"
    raise ServerNotFoundError([f"{source} ({why})"])


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
