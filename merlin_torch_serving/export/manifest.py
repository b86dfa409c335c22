"""What an export records about its files, and the check a step makes before it loads them.

Every file of every step's version folder is recorded with its sha256, next to the library version
and the format it was written in: in the step's own ``step.json`` (python steps check it when
Triton loads them) and in the ensemble's ``manifest.json`` (``verify_export`` checks a whole
export, libtorch models included). A step whose files were changed, truncated or swapped after the
export, or that was written in a format this library does not read, refuses to load and says why.
Each operator's own saved form has a version too (``ServingOperator.version``), checked when the
python step that hosts it loads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

from merlin_torch_serving.exceptions import ArtifactError

#: the layout of step.json, manifest.json and the files beside them; bumped whenever a change would
#: make an older library misread a newer export (or the other way round). 2: operators are rebuilt
#: through __init__ from config() (operator contract 1), and record their own version
STEP_FORMAT_VERSION = 2
MANIFEST_FILE = "manifest.json"
_CHUNK_BYTES = 1 << 20


def library_version() -> str:
    return metadata.version("merlin-torch-serving")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(folder: Path, exclude: Iterable[str] = ()) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``folder`` (paths with ``/``), sorted."""
    excluded = set(exclude)
    digests = {}
    for path in sorted(Path(folder).rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and relative not in excluded and "__pycache__" not in path.parts:
            digests[relative] = sha256_of(path)
    return digests


def step_record(version_dir: Path, exclude: Iterable[str]) -> dict:
    """The fields a step writes about itself: format, library version, its files' digests."""
    return {
        "format_version": STEP_FORMAT_VERSION,
        "library_version": library_version(),
        "artifacts": file_digests(version_dir, exclude),
    }


def verify_step(step: str, version_dir: str | os.PathLike, record: Mapping) -> None:
    """Raise ``ArtifactError`` unless ``record`` (a step.json) is in this library's format and
    every file it lists is in ``version_dir`` with the recorded sha256."""
    check_format(step, record)
    reexport = f"re-export the ensemble with merlin-torch-serving {library_version()}"
    _compare(step, Path(version_dir), record.get("artifacts", {}), reexport)


def check_format(name: str, record: Mapping, kind: str = "step") -> None:
    """Raise ``ArtifactError`` unless ``record`` (a step.json, or with ``kind="ensemble"`` a
    manifest.json) is in the format this library reads."""
    if record.get("format_version") != STEP_FORMAT_VERSION:
        written_with = record.get("library_version", "a version before manifests")
        raise ArtifactError(
            name,
            f"it was exported by merlin-torch-serving {written_with} in step format"
            f" {record.get('format_version')}, and this is {library_version()}, which reads format"
            f" {STEP_FORMAT_VERSION}",
            f"re-export the ensemble with merlin-torch-serving {library_version()}, or serve it"
            f" with merlin-torch-serving {written_with}",
            kind,
        )


def verify_export(repository: str | os.PathLike, name: str, version: int | None = None) -> None:
    """Check every file of ensemble ``name`` (its newest version unless ``version``) against its
    manifest: the libtorch models, which no python code checks when Triton loads them, included."""
    model_dir = Path(repository) / name
    versions = sorted(int(p.name) for p in model_dir.glob("*") if p.name.isdigit())
    if version is None and not versions:
        raise ArtifactError(
            name, f"{str(model_dir)!r} holds no version folder", "export the ensemble there first"
        )
    version = version if version is not None else versions[-1]
    manifest_path = model_dir / str(version) / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as error:
        raise ArtifactError(
            name,
            f"its manifest {str(manifest_path)!r} cannot be read ({error})",
            "re-export it",
            "ensemble",
        ) from error
    check_format(name, manifest, kind="ensemble")
    for step in manifest.get("steps", []):
        step_dir = Path(repository) / step["model"] / str(version)
        _compare(step["model"], step_dir, step.get("artifacts", {}), "re-export the ensemble")


def _compare(step: str, folder: Path, expected: Mapping[str, str], hint: str) -> None:
    for relative, digest in expected.items():
        path = folder / relative
        if not path.is_file():
            raise ArtifactError(step, f"its file {str(path)!r} is missing", hint)
        found = sha256_of(path)
        if found != digest:
            raise ArtifactError(
                step,
                f"its file {str(path)!r} has sha256 {found[:16]}..., not the {digest[:16]}..."
                " recorded at export (it was changed or replaced after the export)",
                hint,
            )
