"""A relocatable Python environment that Triton's python backend runs a step's stub in
(``EXECUTION_ENV_PATH``): this interpreter, its standard library and shared libpython, and the
installed distributions the library needs to serve (its requirements, no extras), nothing else.

Why not venv-pack or conda-pack: a packed venv holds only site-packages and points at the
interpreter it was made from, which a server without this Python lacks; the python backend wants
a whole prefix (``bin/activate``, ``lib/libpython3.X.so``), as conda-pack makes, but conda-pack
packs conda environments only. So the prefix is laid out here from the running interpreter.
Files are hard-linked where the filesystem allows (packing takes seconds), copied elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from merlin_torch_serving.exceptions import BundleError

LIBRARY = "merlin-torch-serving"
PACKED_FILE = "packed.json"
#: standard-library folders a server never imports (tests, GUIs, the static build config)
_STDLIB_LEFT_OUT = (
    "site-packages",
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "config-*",
)
_ACTIVATE = """\
# Made by merlin-torch-serving: puts this relocatable Python first on PATH (as Triton's python
# backend does before it starts a step's stub). Use with `source`.
_mts_env="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
export PATH="$_mts_env/bin:$PATH"
export LD_LIBRARY_PATH="$_mts_env/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset PYTHONHOME PYTHONPATH _mts_env
"""


@dataclass(frozen=True)
class PackedEnvironment:
    path: Path
    python_version: str  # "3.11"
    distributions: dict[str, str]  # name -> version


def requirement_closure(name: str, extras: Iterable[str] = ()) -> set[str]:
    """``name`` and each distribution it requires (with ``extras``), from the installed metadata."""
    seen: set[tuple[str, frozenset]] = set()
    pending = [(canonicalize_name(name), frozenset(extras))]
    while pending:
        current, current_extras = pending.pop()
        if (current, current_extras) in seen:
            continue
        seen.add((current, current_extras))
        try:
            requirements = metadata.requires(current) or []
        except metadata.PackageNotFoundError:
            continue  # reported by pack_environment, which needs every one of them
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is None or any(
                requirement.marker.evaluate({"extra": extra}) for extra in current_extras or {""}
            ):
                pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return {dist for dist, _ in seen}


def serving_distributions(extra: Iterable[str] = ()) -> list[str]:
    """What a python step needs: this library's requirements without extras, plus ``extra``
    distributions and theirs (say, transformers4rec for a step that hosts an eager T4R model)."""
    names = requirement_closure(LIBRARY)
    for name in extra:
        names |= requirement_closure(name)
    return sorted(names)


def pack_environment(
    target: str | os.PathLike,
    distributions: Iterable[str] | None = None,
    *,
    progress: Callable[[str], None] = lambda line: None,
) -> PackedEnvironment:
    """Lay out the environment at ``target`` (which must not exist); built beside it, renamed in."""
    target = Path(target)
    if target.exists():
        raise BundleError(f"{str(target)!r} already exists; remove it or pack into a new folder")
    names = sorted(distributions) if distributions is not None else serving_distributions()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        progress(f"Python {platform.python_version()} from {sys.base_prefix}")
        _lay_out_interpreter(staging, version)
        site_packages = staging / "lib" / f"python{version}" / "site-packages"
        site_packages.mkdir()
        packed = {}
        for name in names:
            packed[name] = _copy_distribution(name, site_packages)
        progress(f"{len(packed)} distributions: {', '.join(names)}")
        (staging / "bin" / "activate").write_text(_ACTIVATE)
        record = {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "distributions": packed,
        }
        (staging / PACKED_FILE).write_text(json.dumps(record, indent=1))
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PackedEnvironment(target, version, packed)


def read_packed(path: str | os.PathLike) -> PackedEnvironment:
    """A folder ``pack_environment`` made; its Python version decides the stub that runs it."""
    path = Path(path)
    try:
        record = json.loads((path / PACKED_FILE).read_text())
    except (OSError, ValueError) as error:
        raise BundleError(
            f"{str(path)!r} is not an environment packed by merlin-torch-serving (no readable"
            f" {PACKED_FILE}: {error})"
        ) from error
    return PackedEnvironment(
        path, ".".join(record["python"].split(".")[:2]), record["distributions"]
    )


def archive(environment: Path, tarball: Path) -> None:
    """A ``.tar.gz`` of the environment, as the python backend extracts it.

    Its paths are relative to the environment's root.
    """
    with tarfile.open(tarball, "w:gz", compresslevel=1) as archive_file:
        for entry in sorted(environment.iterdir()):
            archive_file.add(entry, arcname=entry.name)


def link_tree(source: Path, target: Path) -> None:
    """Copy a folder cheaply: hard links where the filesystem allows, copies elsewhere."""
    shutil.copytree(source, target, copy_function=_link_or_copy, symlinks=True)


# ---- the interpreter ---------------------------------------------------------------------------


def _lay_out_interpreter(prefix: Path, version: str) -> None:
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not (libdir / soname).is_file():
        raise BundleError(
            f"this Python ({sys.base_prefix}) was built without a shared libpython, which the"
            " python-backend stub loads; pack from a Python built with --enable-shared"
            " (distribution packages, pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared, the"
            " python.org builds)"
        )
    (prefix / "bin").mkdir()
    (prefix / "lib").mkdir()
    executable = Path(sysconfig.get_config_var("BINDIR")) / f"python{version}"
    # a real file, not a link: the embedded interpreter finds its prefix from the resolved path
    _link_or_copy(str(executable.resolve()), str(prefix / "bin" / f"python{version}"))
    for alias in ("python3", "python"):
        (prefix / "bin" / alias).symlink_to(f"python{version}")
    for library in libdir.glob(f"libpython{version}*.so*"):
        if library.is_symlink():
            (prefix / "lib" / library.name).symlink_to(os.readlink(library))
        else:
            _link_or_copy(str(library), str(prefix / "lib" / library.name))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shutil.copytree(
        stdlib,
        prefix / "lib" / f"python{version}",
        copy_function=_link_or_copy,
        symlinks=True,
        ignore=lambda folder, names: (
            shutil.ignore_patterns(*_STDLIB_LEFT_OUT)(folder, names)
            if Path(folder) == stdlib
            else []
        ),
    )


# ---- distributions -----------------------------------------------------------------------------


def _copy_distribution(name: str, site_packages: Path) -> str:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise BundleError(
            f"distribution {name!r} is needed in the packed environment but is not installed in"
            f" this Python ({sys.prefix}); install it, or leave it out of the distributions to pack"
        ) from None
    root = Path(str(dist.locate_file(""))).resolve()
    if _installed_normally(dist):
        for file in dist.files or ():
            relative = Path(file)
            source = Path(str(dist.locate_file(file)))
            if relative.parts[0] == ".." or not source.is_file() or "__pycache__" in relative.parts:
                continue  # console scripts outside site-packages; bytecode is rebuilt on import
            destination = site_packages / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            if not destination.exists():
                _link_or_copy(str(source), str(destination))
    else:
        _copy_packages_of(dist, name, root, site_packages)
    return dist.version


def _installed_normally(dist) -> bool:
    """A wheel install (dist-info with a RECORD), not an editable or an egg-info source tree."""
    direct_url = dist.read_text("direct_url.json")
    editable = bool(direct_url and json.loads(direct_url).get("dir_info", {}).get("editable"))
    return dist.read_text("RECORD") is not None and not editable


def _copy_packages_of(dist, name: str, root: Path, site_packages: Path) -> None:
    """Copy an editable or source-tree install.

    Its import packages are copied as they are, and it gets a minimal dist-info.
    """
    top_level = (
        dist.read_text("top_level.txt") or canonicalize_name(name).replace("-", "_")
    ).split()
    for package in top_level:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise BundleError(
                f"cannot find the import package {package!r} of distribution {name!r} to pack it"
            )
        source = Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)
        if source.is_dir():
            shutil.copytree(
                source, site_packages / source.name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(source, site_packages / source.name)
    info = site_packages / f"{canonicalize_name(name).replace('-', '_')}-{dist.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {dist.version}\n"
    )


def _link_or_copy(source: str, destination: str) -> str:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
    return destination
