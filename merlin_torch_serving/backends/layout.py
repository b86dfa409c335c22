"""The backend folder a tritonserver is started with (``--backend-directory``): nvidia-pytriton's
python backend with the stub for this Python and, when it has been built for the running torch,
the pytorch (libtorch) backend beside it.

Folders are laid out once in the cache and reused; each is built beside its final name and
renamed into place, so a concurrent or interrupted start never sees half a folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from merlin_torch_serving.backends import bundle
from merlin_torch_serving.backends.pytorch_build import (
    BACKEND_LIBRARY,
    BUILD_COMMAND,
    BuiltBackend,
    TorchInstall,
    built_for_running_torch,
)
from merlin_torch_serving.exceptions import ServerError

STUB_NAME = "triton_python_backend_stub"
_LAYOUTS_FOLDER = "backends"


def python_backend_directory(
    *, python_version: str | None = None, cache_dir: str | os.PathLike | None = None
) -> Path:
    """A backend folder holding nvidia-pytriton's python backend with the stub for
    ``python_version``.

    The wheel ships one stub per Python version and the stub must match the Python whose packages
    the models import, so the folder is laid out per version, once, and reused afterwards.
    """
    python_version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    server_root = bundle.pytriton_server_root()
    if server_root is None:
        raise ServerError(
            "the python backend comes from the nvidia-pytriton package, which is not installed; run"
            " `pip install 'merlin-torch-serving[server]'` or pass"
            " TritonServer(backend_directory=...)"
        )
    pytriton_version = bundle.pytriton_version()
    stubs = server_root / "python_backend_stubs"
    stub = stubs / python_version / STUB_NAME
    if not stub.is_file():
        available = sorted(
            (
                (entry.name for entry in stubs.iterdir() if (entry / STUB_NAME).is_file())
                if stubs.is_dir()
                else ()
            ),
            key=lambda version: [
                int(part) if part.isdigit() else -1 for part in version.split(".")
            ],
        )
        raise ServerError(
            f"nvidia-pytriton {pytriton_version} has no python-backend stub for Python"
            f" {python_version!r} (it has stubs for Python {', '.join(available) or 'no version'});"
            " run under one of those Python versions, or pass TritonServer(backend_directory=...)"
            " pointing at a folder whose python/ subfolder holds a stub built for Python"
            f" {python_version}"
        )
    cache_dir = Path(cache_dir) if cache_dir is not None else bundle.cache_root() / _LAYOUTS_FOLDER
    target = cache_dir / f"pytriton-{pytriton_version}-py{python_version}"

    def lay_out(staging: Path) -> None:
        _copy_python_backend(server_root / "backends" / "python", stub, staging / "python")

    return _laid_out(target, "python" + os.sep + STUB_NAME, lay_out)


def bundled_backend_directory(binary: str | os.PathLike | None = None) -> Path:
    """The backend folder for nvidia-pytriton's tritonserver: the python backend, plus the pytorch
    backend when ``merlin-torch-serving build-backend pytorch`` has built it for this torch and
    this server's version."""
    python_only = python_backend_directory()
    built = built_for_running_torch(binary)
    if built is None:
        return python_only
    torch = TorchInstall.running()
    server_library = bundle.libtritonserver()
    if server_library is None:
        return python_only
    target = (
        python_only.parent / f"{python_only.name}-{_pytorch_folder_name(built, server_library)}"
    )

    def lay_out(staging: Path) -> None:
        shutil.copytree(python_only / "python", staging / "python", symlinks=True)
        _lay_out_pytorch_backend(built, torch, server_library, staging / "pytorch")

    return _laid_out(target, "pytorch" + os.sep + BACKEND_LIBRARY, lay_out)


def pytorch_backend_directory(
    binary: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None
) -> Path:
    """A backend folder holding Triton's pytorch backend alone, without the python backend: a
    tritonserver started with it serves libtorch models only, as a serving image without Python
    does (``TritonServer(repository, backend_directory=pytorch_backend_directory())``)."""
    built = built_for_running_torch(binary)
    server_library = bundle.libtritonserver()
    if built is None or server_library is None:
        raise ServerError(
            "Triton's pytorch backend is not built for this torch and the bundled tritonserver"
            f" (or nvidia-pytriton is not installed); build it with `{BUILD_COMMAND}`"
        )
    cache_dir = Path(cache_dir) if cache_dir is not None else bundle.cache_root() / _LAYOUTS_FOLDER
    folder = _pytorch_folder_name(built, server_library)
    target = cache_dir / f"pytriton-{bundle.pytriton_version()}-pytorch-only-{folder}"

    def lay_out(staging: Path) -> None:
        _lay_out_pytorch_backend(built, TorchInstall.running(), server_library, staging / "pytorch")

    return _laid_out(target, "pytorch" + os.sep + BACKEND_LIBRARY, lay_out)


def _pytorch_folder_name(built: BuiltBackend, server_library: Path) -> str:
    """The pytorch folder links into this interpreter's torch and wheel and copies the build, so it
    is laid out per install and per build."""
    torch = TorchInstall.running()
    identity = "\n".join(
        map(str, (built.library, built.library.stat().st_mtime_ns, torch.lib, server_library))
    )
    return f"torch-{torch.version}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"


def _copy_python_backend(source: Path, stub: Path, target: Path) -> None:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, target / STUB_NAME)


def _lay_out_pytorch_backend(
    built: BuiltBackend, torch: TorchInstall, server_library: Path, target: Path
) -> None:
    """``pytorch/``: the backend library, and links that let the loader find what it needs.

    The library's RUNPATH is ``$ORIGIN``, so its dependencies are looked up beside it: the server
    library under the name it was linked against (the wheel renamed it), and every file of torch's
    ``lib/``. The library itself is copied, since ``$ORIGIN`` of a link is the link's folder.
    """
    target.mkdir()
    shutil.copy2(built.library, target / BACKEND_LIBRARY)
    (target / "libtritonserver.so").symlink_to(server_library)
    for entry in sorted(torch.lib.iterdir()):
        if entry.is_file() and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)


def _laid_out(target: Path, marker: str, lay_out: Callable[[Path], None]) -> Path:
    """``target``, laid out by ``lay_out(staging)`` unless ``target/marker`` already exists."""
    if (target / marker).is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            lay_out(staging)
            try:
                os.rename(staging, target)
            except OSError:
                if not (target / marker).is_file():
                    raise
                # Another process laid the folder out first; its copy is as good as ours.
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        raise ServerError(
            f"could not lay out the backends in {str(target)!r}: {error}; make"
            f" {str(target.parent)!r} writable (or set {bundle.CACHE_ENV_VAR} to a writable folder)"
            " or pass TritonServer(backend_directory=...)"
        ) from error
    return target
