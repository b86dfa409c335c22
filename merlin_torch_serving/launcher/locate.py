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
from collections.abc import Mapping
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
    return allocator_environment(environment)


#: buffers of this size or more are mapped on their own, and unmapped when freed
MMAP_THRESHOLD_BYTES = 1 << 20
#: the top of a heap is returned to the OS once this much of it is free
TRIM_THRESHOLD_BYTES = 8 << 20
_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def allocator_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` with glibc's malloc thresholds set for tritonserver and its stubs, unless
    the caller set any of them (theirs win).

    glibc raises its ``mmap`` threshold each time a big buffer is freed, up to 32 MB, after which
    the buffers of a big request come from the heap and stay with the process when freed: one
    request of a million clicks left a stub hundreds of megabytes bigger for good. A fixed
    threshold of a megabyte maps every bigger buffer on its own and unmaps it when freed, and the
    top of the heap is returned once 8 MB of it are free. A one-session request allocates nothing
    that big, so the usual traffic runs as before.
    """
    tunables = environment.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables or any(name in environment for name in _MALLOC_VARIABLES):
        return dict(environment)
    settings = (
        f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}"
        f":glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}"
    )
    return {**environment, "GLIBC_TUNABLES": f"{tunables}:{settings}" if tunables else settings}


def _checked_binary(path: Path, source: str) -> Path:
    if _is_executable(path):
        return path
    why = "not executable" if path.exists() else "does not exist"
    raise ServerNotFoundError([f"{source} ({why})"])


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
