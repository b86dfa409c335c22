"""Building Triton's pytorch (libtorch) backend, ``libtriton_pytorch.so``, for the tritonserver that
nvidia-pytriton bundles and the torch of the running interpreter, with cmake.

The bundled server ships only the python backend. The pytorch backend is a small C++ library
compiled against torch's headers and libraries, so it is built here, with the project's change
(``pytorch_change``: it also serves AOTInductor packages), once per (tritonserver, torch, change),
into the cache (see ``bundle.cache_root``); a second call with the same three returns the cached
build at once.

Sources come either from ``sources`` (the build then needs no network) or, without it, from
shallow clones of upstream at the release matching the server (needs git and the network;
``sources_unavailable`` tells beforehand whether they can be had); ``pytorch_sources.py`` says what
they hold and where they are cloned from.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from merlin_torch_serving.backends import bundle, pytorch_change, pytorch_sources
from merlin_torch_serving.backends.build_tools import BUILD_COMMAND as BUILD_COMMAND
from merlin_torch_serving.backends.build_tools import BuildTools, build_tools
from merlin_torch_serving.exceptions import BackendBuildError

BACKEND_LIBRARY = "libtriton_pytorch.so"
BUILD_RECORD = "build.json"

_BUILDS_FOLDER = "builds"
_LOG_TAIL_LINES = 40
_PROGRESS = re.compile(r"^\[\s*(\d+)/(\d+)\]|^\[\s*(\d+)%\]")


@dataclass(frozen=True)
class TorchInstall:
    """The torch the backend is compiled and linked against, found without importing torch."""

    version: str
    root: Path  # the ``torch`` package folder: include/ and lib/

    @classmethod
    def running(cls) -> TorchInstall:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            raise BackendBuildError(
                "torch is not installed in this interpreter; install it first (pip install torch)"
            )
        return cls(importlib.metadata.version("torch"), Path(spec.origin).parent)

    @property
    def lib(self) -> Path:
        return self.root / "lib"


@dataclass(frozen=True)
class BuiltBackend:
    """A built ``libtriton_pytorch.so`` in the cache and what it was built for."""

    folder: Path
    torch_version: str
    tritonserver_version: str
    #: False when it came from the cache
    built_now: bool = False

    @property
    def library(self) -> Path:
        return self.folder / BACKEND_LIBRARY


def build_folder(
    tritonserver_version: str, torch_version: str, cache_dir: Path | None = None
) -> Path:
    """Where the build for this server and torch, with the project's change as it is now, lives
    (whether or not it exists). A build without the change, or with another version of it, lives
    elsewhere and is never taken for it."""
    root = cache_dir if cache_dir is not None else bundle.cache_root() / _BUILDS_FOLDER
    return root / (
        f"libtriton_pytorch-tritonserver-{tritonserver_version}-torch-{torch_version}"
        f"-change-{pytorch_change.change_id()}"
    )


def built_pytorch_backend(
    tritonserver_version: str, torch_version: str, cache_dir: Path | None = None
) -> BuiltBackend | None:
    """The cached build for this tritonserver and torch, or None."""
    folder = build_folder(tritonserver_version, torch_version, cache_dir)
    if not (folder / BACKEND_LIBRARY).is_file():
        return None
    return BuiltBackend(folder, torch_version, tritonserver_version)


def built_for_running_torch(binary: str | os.PathLike | None = None) -> BuiltBackend | None:
    """The cached build for ``binary`` and the running torch, or None.

    ``binary`` defaults to the bundled tritonserver.
    """
    binary = binary if binary is not None else bundle.bundled_tritonserver()
    version = bundle.tritonserver_version(binary) if binary is not None else None
    if version is None or importlib.util.find_spec("torch") is None:
        return None
    return built_pytorch_backend(version, TorchInstall.running().version)


def build_pytorch_backend(
    *,
    sources: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    jobs: int | None = None,
    progress: Callable[[str], None] = print,
    git_host: str | None = None,
) -> BuiltBackend:
    """Build (or find in the cache) the pytorch backend for the bundled tritonserver and this torch.

    ``cache_dir`` is the folder builds go in (default: ``builds/`` of ``bundle.cache_root()``).
    ``progress`` receives one line per step and per build step of cmake. ``git_host`` is where the
    upstream repositories are cloned from when ``sources`` is None (default:
    ``pytorch_sources.git_host()``).
    """
    torch = TorchInstall.running()
    server_version = _bundled_server_version()
    cache = Path(cache_dir) if cache_dir is not None else None
    cached = built_pytorch_backend(server_version, torch.version, cache)
    if cached is not None:
        return cached
    tools = build_tools(cloning=sources is None)
    target = build_folder(server_version, torch.version, cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    log = work / "build.log"
    try:
        source_root, options, origin = prepared_sources(
            sources, server_version, work / "sources", log, progress, git_host
        )
        progress("applying the project's change (AOTInductor packages) to src/libtorch.cc")
        backend = pytorch_change.changed_backend(source_root, work / "changed")
        configure(tools, torch, source_root, options, work / "build", log, progress, backend)
        library = _compile(tools, work / "build", log, jobs, progress)
        record = {
            "torch_version": torch.version,
            "torch_root": str(torch.root),
            "tritonserver_version": server_version,
            "sources": origin,
            "change": pytorch_change.PATCH_FILE.name,
            "change_id": pytorch_change.change_id(),
            "built_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        _install(library, record, work / "result", target)
    except BackendBuildError as error:
        if not log.is_file():
            raise
        kept = target.parent / f"{target.name}.failed.log"
        shutil.copy2(log, kept)
        raise BackendBuildError(f"{error}\nfull build log: {kept}") from error
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"built in {time.monotonic() - started:.0f} s")
    return BuiltBackend(target, torch.version, server_version, built_now=True)


def sources_unavailable(git_host: str | None = None) -> str | None:
    """Why the sources for the bundled tritonserver cannot be cloned here, or None when they can.

    ``./run setup`` builds the backend by itself unless this names a reason (no git, no network,
    no such release on the host).
    """
    release = _release(_bundled_server_version())
    return pytorch_sources.unreachable(pytorch_sources.git_host(git_host), release)


def prepared_sources(
    sources: str | os.PathLike | None,
    server_version: str,
    destination: Path,
    log: Path,
    progress: Callable[[str], None],
    git_host: str | None = None,
) -> tuple[Path, list[str], str]:
    """The folder holding ``pytorch_backend/`` and ``rapidjson/``, the cmake options that point the
    build at them and at the rest, and where they came from (for the build record).

    From ``sources`` when given (unpacked into ``destination`` if a tarball), else cloned into
    ``destination`` from ``git_host`` at the release of ``server_version``.
    """
    if sources is not None:
        source_root = pytorch_sources.unpacked(Path(sources), destination, progress)
        return (
            source_root,
            pytorch_sources.offline_options(source_root),
            os.fspath(Path(sources).resolve()),
        )
    host = pytorch_sources.git_host(git_host)
    release = _release(server_version)
    repository = pytorch_sources.pytorch_backend_repository(host)
    progress(f"cloning pytorch_backend {release} and RapidJSON from {host} (needs the network)")
    clones = [
        (repository, release, destination / "pytorch_backend"),
        (
            pytorch_sources.rapidjson_repository(host),
            pytorch_sources.RAPIDJSON_BRANCH,
            destination / "rapidjson",
        ),
    ]
    for clone in clones:
        _run(pytorch_sources.clone_command(*clone), log, "git clone")
    pytorch_sources.lay_out_rapidjson(destination / "rapidjson")
    return (
        destination,
        pytorch_sources.upstream_options(destination, release, host),
        f"{repository}@{release}",
    )


def configure(
    tools: BuildTools,
    torch: TorchInstall,
    source_root: Path,
    options: list[str],
    build: Path,
    log: Path,
    progress: Callable[[str], None],
    backend: Path | None = None,
) -> None:
    """cmake's configure step into ``build`` of ``backend`` (default: the sources'
    ``pytorch_backend``): where sources come by git, CMake clones the three dependencies here."""
    progress(f"configuring with cmake for torch {torch.version}")
    _run(
        [
            tools.cmake,
            "-S",
            str(backend if backend is not None else source_root / "pytorch_backend"),
            "-B",
            str(build),
            "-G",
            tools.generator,
            "-Wno-dev",
            *_cmake_options(torch, tools),
            *options,
        ],
        log,
        "cmake configure",
    )


def _compile(tools: BuildTools, build: Path, log: Path, jobs, progress) -> Path:
    """cmake's build step; the path of the library it built."""
    progress(f"compiling {BACKEND_LIBRARY} (under a minute on 2 cores)")
    _run(
        [
            tools.cmake,
            "--build",
            str(build),
            "--target",
            "triton-pytorch-backend",
            "-j",
            str(jobs or os.cpu_count() or 1),
        ],
        log,
        "cmake build",
        on_line=lambda line: _report_progress(line, progress),
    )
    return build / BACKEND_LIBRARY


def _install(library: Path, record: dict, staging: Path, target: Path) -> None:
    """The library and its record, renamed into ``target`` whole.

    A failed build leaves nothing there.
    """
    staging.mkdir()
    shutil.copy2(library, staging / BACKEND_LIBRARY)
    (staging / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    try:
        os.rename(staging, target)
    except OSError:
        if not (target / BACKEND_LIBRARY).is_file():
            raise
        # another process finished the same build first; its library is as good as ours


# ---- inputs -----------------------------------------------------------------------------------


def _bundled_server_version() -> str:
    binary = bundle.bundled_tritonserver()
    if binary is None or not binary.is_file():
        raise BackendBuildError(
            "the pytorch backend is built for the tritonserver bundled with nvidia-pytriton, which"
            " is not installed; run `pip install 'merlin-torch-serving[server]'` (nvidia-pytriton)"
        )
    version = bundle.tritonserver_version(binary)
    if version is None:
        raise BackendBuildError(
            f"could not tell the version of {str(binary)!r}: it did not print a server_version when"
            " started; check that it runs (`tritonserver --help`)"
        )
    return version


def _release(server_version: str) -> str:
    try:
        return bundle.release_of(server_version)
    except ValueError as error:
        raise BackendBuildError(
            f"{error}; pass --sources with Triton's pytorch_backend sources for this server"
        ) from error


# ---- cmake ------------------------------------------------------------------------------------


def _cmake_options(torch: TorchInstall, tools: BuildTools) -> list[str]:
    """What every build sets: CPU only, no torchvision or TensorRT, this torch and this Python."""
    include = torch.root / "include"
    api_include = include / "torch" / "csrc" / "api" / "include"
    return [
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CXX_COMPILER={tools.compiler}",
        "-DTRITON_ENABLE_GPU=OFF",
        "-DTRITON_ENABLE_STATS=ON",
        "-DTRITON_PYTORCH_ENABLE_TORCHVISION=OFF",
        "-DTRITON_PYTORCH_ENABLE_TORCHTRT=OFF",
        # torch 2.x's CMake config asks for C++17 or newer and recent releases use C++20 features
        "-DTRITON_MIN_CXX_STANDARD=20",
        f"-DTRITON_PYTORCH_INCLUDE_PATHS={include};{api_include}",
        f"-DTRITON_PYTORCH_LIB_PATHS={torch.lib}",
        # torch's headers include Python.h
        f"-DPython3_EXECUTABLE={sys.executable}",
        f"-DPython3_INCLUDE_DIR={sysconfig.get_paths()['include']}",
    ]


def _run(
    command: Sequence[str], log_path: Path, what: str, on_line: Callable[[str], None] | None = None
) -> None:
    """Run ``command``, appending its output to ``log_path``.

    A failure raises with the log's tail.
    """
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        try:
            process = subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **pytorch_sources.GIT_ENVIRONMENT},
                text=True,
                errors="replace",
            )
        except OSError as error:
            raise BackendBuildError(f"{what} could not run {command[0]!r}: {error}") from error
        with process:
            for line in process.stdout or ():  # never None: stdout is a pipe
                log.write(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
        code = process.wait()
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[
            -_LOG_TAIL_LINES:
        ]
        raise BackendBuildError(
            f"{what} failed (exit code {code}); the last lines of its output:\n" + "\n".join(tail)
        )


def _report_progress(line: str, progress: Callable[[str], None]) -> None:
    """Pass on ninja's and make's progress lines, shortened.

    They look like ``[3/12] Building ...`` (ninja) and ``[ 25%] Building ...`` (make).
    """
    if _PROGRESS.match(line):
        progress("  " + re.sub(r" \S*/", " ", line, count=1)[:160])
