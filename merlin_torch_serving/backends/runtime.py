"""A serving runtime without Python: the bundled tritonserver, the libraries it loads and Triton's
pytorch backend with the part of libtorch it needs, copied into one folder. It serves exports that
are libtorch models only (``TransformWorkflow(..., backend="pytorch")`` with the model on
libtorch), on a machine, or in an image (``deploy-files --runtime libtorch``), that has neither
Python nor this library.

    <target>/pytriton/tritonserver/bin/tritonserver   the server (its RPATH finds the libraries)
    <target>/nvidia_pytriton.libs/                    its libraries, as the wheel ships them
    <target>/backends/pytorch/                        the backend, libtritonserver.so (a link to
                                                      the server's) and libtorch's libraries

Run it as ``<target>/pytriton/tritonserver/bin/tritonserver --model-repository=REPOSITORY
--backend-directory=<target>/backends``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from merlin_torch_serving.backends import bundle
from merlin_torch_serving.backends.layout import pytorch_backend_directory
from merlin_torch_serving.backends.pytorch_build import BACKEND_LIBRARY
from merlin_torch_serving.exceptions import ServerError

SERVER_BINARY = Path("pytriton") / "tritonserver" / "bin" / "tritonserver"
LIBRARIES = "nvidia_pytriton.libs"
BACKENDS = "backends"


def lay_out_libtorch_runtime(target: str | os.PathLike) -> Path:
    """Copy the runtime into ``target`` (which must not exist); returns the server binary."""
    target = Path(target)
    if target.exists():
        raise ServerError(f"{str(target)!r} exists; lay the runtime out into a new folder")
    server_root = bundle.pytriton_server_root()
    libraries = bundle.pytriton_libraries()
    server_library = bundle.libtritonserver()
    if server_root is None or libraries is None or server_library is None:
        raise ServerError(
            "the runtime copies the tritonserver of nvidia-pytriton, which is not installed; run"
            " `pip install 'merlin-torch-serving[server]'`"
        )
    source_backend = pytorch_backend_directory() / "pytorch"
    binary = target / SERVER_BINARY
    binary.parent.mkdir(parents=True)
    shutil.copy2(server_root / "bin" / "tritonserver", binary)
    shutil.copytree(libraries, target / LIBRARIES)
    backend = target / BACKENDS / "pytorch"
    backend.mkdir(parents=True)
    shutil.copy2(source_backend / BACKEND_LIBRARY, backend / BACKEND_LIBRARY)
    # the server's own library, which the server has loaded already: a link to the same file
    (backend / "libtritonserver.so").symlink_to(Path("..") / ".." / LIBRARIES / server_library.name)
    for name in sorted(_needed_from(source_backend / BACKEND_LIBRARY, source_backend)):
        if name != "libtritonserver.so":
            shutil.copy2((source_backend / name).resolve(), backend / name)
    return binary


def _needed_from(library: Path, folder: Path) -> set[str]:
    """The files of ``folder`` that ``library`` loads, directly or through one another (ldd)."""
    try:
        listing = subprocess.run(
            ["ldd", str(library)], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise ServerError(
            f"could not list the libraries {library.name} loads with ldd: {error}"
        ) from error
    needed = set()
    for line in listing.splitlines():
        name, _, found = line.strip().partition(" => ")
        if found and Path(found.split(" (")[0]).parent == folder:
            needed.add(name)
    return needed
