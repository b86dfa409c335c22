"""What the nvidia-pytriton wheel bundles (tritonserver, its python backend, the renamed
libtritonserver), which tritonserver version that is, and where this library caches what it lays
out and builds beside it."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import tempfile
from pathlib import Path

#: overrides where laid-out backend folders and built backends are kept
CACHE_ENV_VAR = "MTS_CACHE_DIR"

_SERVER_VERSION = re.compile(r"^\|\s*server_version\s*\|\s*(\S+)\s*\|", re.MULTILINE)
_VERSION_TIMEOUT_S = 60.0


def pytriton_server_root() -> Path | None:
    """``<site-packages>/pytriton/tritonserver``, found without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def bundled_tritonserver() -> Path | None:
    """The tritonserver binary inside nvidia-pytriton, if the package is installed."""
    root = pytriton_server_root()
    return root / "bin" / "tritonserver" if root is not None else None


def pytriton_libraries() -> Path | None:
    """The folder of the wheel's shared libraries, libtritonserver included.

    That is ``<site-packages>/nvidia_pytriton.libs``.
    """
    root = pytriton_server_root()
    return root.parent.parent / "nvidia_pytriton.libs" if root is not None else None


def libtritonserver() -> Path | None:
    """The wheel's ``libtritonserver-<hash>.so`` (renamed when the wheel was repaired).

    Backends are linked against ``libtritonserver.so``; the pytorch backend's folder links that
    name to this file.
    """
    libraries = pytriton_libraries()
    if libraries is None or not libraries.is_dir():
        return None
    return next(iter(sorted(libraries.glob("libtritonserver*.so*"))), None)


def pytriton_version() -> str:
    try:
        return importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cache_root() -> Path:
    """$MTS_CACHE_DIR, else ``$XDG_CACHE_HOME/merlin_torch_serving``, else
    ``~/.cache/merlin_torch_serving``."""
    chosen = os.environ.get(CACHE_ENV_VAR)
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "merlin_torch_serving"


def tritonserver_version(binary: str | os.PathLike) -> str | None:
    """The version a tritonserver binary reports (e.g. ``"2.51.0"``), or None if it does not say.

    tritonserver has no ``--version``; it prints its version in the options table it logs before
    it looks at the model repository, so a start on a repository that does not exist, with every
    endpoint off, reports it and exits at once (~30 ms).
    """
    binary = Path(binary)
    try:
        stat = binary.stat()
    except OSError:
        return None
    return _reported_version(str(binary), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _reported_version(binary: str, _mtime_ns: int, _size: int) -> str | None:
    with tempfile.TemporaryDirectory(prefix="mts-version-") as scratch:
        try:
            finished = subprocess.run(
                [
                    binary,
                    f"--model-repository={os.path.join(scratch, 'none')}",
                    "--allow-http=false",
                    "--allow-grpc=false",
                    "--allow-metrics=false",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_VERSION_TIMEOUT_S,
            )
        except (OSError, subprocess.SubprocessError):
            return None
    match = _SERVER_VERSION.search(
        finished.stdout.decode(errors="replace") + finished.stderr.decode(errors="replace")
    )
    return match.group(1) if match else None


def release_of(server_version: str) -> str:
    """The release branch of a tritonserver version: 2.51.0 is ``r24.10``.

    Triton releases monthly and numbers the server one minor version per release: 2.41 was
    23.12, so 2.N is N - 41 months later.
    """
    major, minor = (int(part) for part in server_version.split(".")[:2])
    if major != 2 or minor < 41:
        raise ValueError(
            f"no release branch known for tritonserver {server_version} (2.41 and newer are)"
        )
    months = 12 + (minor - 41)  # months after the end of 2022
    year, month = 23 + (months - 1) // 12, (months - 1) % 12 + 1
    return f"r{year}.{month:02d}"
