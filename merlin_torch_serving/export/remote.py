"""Exporting to object storage (any fsspec URL: ``s3://``, ``gs://``, ``az://``, ``memory://``,
...).

The repository is written by the local writer (``export.repository``) into a scratch folder that
mirrors the remote one's model and version folders, checked, uploaded, and flipped last: every
model's files go up before its ``config.pbtxt``, and the ensemble's ``config.pbtxt`` goes up after
every other file has been uploaded and its size checked. Object stores have no atomic rename, so
a reader that loads the ensemble sees the previous export (``add_version``: it stays whole until
the flip), or, while ``overwrite`` replaces models in place, no ensemble at all: its config is
removed first. A failed upload leaves no new ensemble config behind.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import tempfile
from pathlib import Path

from merlin_torch_serving.exceptions import ExportError
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.repository import MANIFEST_FILE, ExportResult, export_ensemble

CONFIG_FILE = "config.pbtxt"


def export_to_url(
    ensemble,
    url: str,
    name: str,
    *,
    overwrite: bool = False,
    add_version: bool = False,
    options: configs.ModelOptions = configs.ModelOptions(),
    storage_options: dict | None = None,
) -> ExportResult:
    """``export_ensemble`` to the repository at ``url``; ``storage_options`` go to the filesystem
    (e.g. ``{"endpoint_url": ...}`` for an S3-compatible store; credentials as the filesystem reads
    them).
    """
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as error:
        raise ExportError(
            f"cannot export to {url!r}: {error}; install the filesystem of that protocol "
            "(s3://: `pip install 'merlin-torch-serving[s3]'`; gs://: gcsfs; az://: adlfs)"
        ) from error
    root = root.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="mts-export-") as scratch:
        local = Path(scratch) / "repository"
        before = _mirror_layout(fs, root, local, name)
        result = export_ensemble(
            ensemble, local, name, overwrite=overwrite, add_version=add_version, options=options
        )
        files = _files_to_upload(local, result, add_version)
        _check_staged(local, files)
        replaced = [model for model in result.models if model in before and not add_version]
        removed = [model for model in before if not (local / model).is_dir()]
        try:
            _upload(
                fs, root, local, files, name, unpublish=bool(replaced), remove=replaced + removed
            )
        except OSError as error:
            raise ExportError(
                f"uploading the repository to {url!r} failed: {error}; the ensemble {name!r} was"
                " not published (its config.pbtxt goes up last), so run the export again"
            ) from error
    return dataclasses.replace(result, path=url)


def _mirror_layout(fs, root: str, local: Path, name: str) -> set[str]:
    """Lay the remote model and version folders out locally (empty), with the ensemble's manifests,
    so the local writer sees which models exist and which versions they have."""
    local.mkdir()
    if not fs.exists(root):
        return set()
    models = set()
    for model_path in fs.ls(root, detail=False, refresh=True):
        model = posixpath.basename(model_path.rstrip("/"))
        if not fs.isdir(model_path):
            continue
        models.add(model)
        (local / model).mkdir()
        for version_path in fs.ls(model_path, detail=False, refresh=True):
            version = posixpath.basename(version_path.rstrip("/"))
            if version.isdigit() and fs.isdir(version_path):
                (local / model / version).mkdir()
                manifest = posixpath.join(version_path, MANIFEST_FILE)
                if model == name and fs.exists(manifest):
                    (local / model / version / MANIFEST_FILE).write_bytes(fs.cat_file(manifest))
    return models


def _files_to_upload(local: Path, result: ExportResult, add_version: bool) -> list[str]:
    """Relative paths of what this export wrote, in the order to upload them.

    Each model's config.pbtxt comes after its other files, and the ensemble comes last.
    """
    ordered = []
    for model in [*[m for m in result.models if m != result.name], result.name]:
        model_dir = local / model
        files = [
            path.relative_to(local).as_posix()
            for path in sorted(model_dir.rglob("*"))
            if path.is_file() and (not add_version or _is_new(path, model_dir, result.version))
        ]
        config = f"{model}/{CONFIG_FILE}"
        ordered += [f for f in files if f != config] + [config]
    return ordered


def _is_new(path: Path, model_dir: Path, version: int) -> bool:
    top = path.relative_to(model_dir).parts[0]
    return not top.isdigit() or int(top) == version


def _check_staged(local: Path, files: list[str]) -> None:
    """Every config parses as a Triton model config and every model has its version folder."""
    for relative in files:
        if relative.endswith("/" + CONFIG_FILE):
            try:
                configs.from_pbtxt((local / relative).read_text())
            except Exception as error:  # a text_format ParseError
                raise ExportError(
                    f"the staged {relative!r} is not a valid Triton model config: {error}"
                ) from error
        elif relative.endswith("/" + MANIFEST_FILE):
            json.loads((local / relative).read_text())


def _upload(
    fs, root: str, local: Path, files: list[str], name: str, *, unpublish: bool, remove: list[str]
) -> None:
    ensemble_config = f"{name}/{CONFIG_FILE}"
    if unpublish and fs.exists(f"{root}/{ensemble_config}"):
        fs.rm_file(f"{root}/{ensemble_config}")
    for model in remove:
        if fs.exists(f"{root}/{model}"):
            fs.rm(f"{root}/{model}", recursive=True)
    for relative in files[:-1]:
        fs.put_file(str(local / relative), f"{root}/{relative}")
    _check_uploaded(fs, root, local, files[:-1])
    fs.put_file(str(local / ensemble_config), f"{root}/{ensemble_config}")


def _check_uploaded(fs, root: str, local: Path, files: list[str]) -> None:
    fs.invalidate_cache()
    for relative in files:
        remote = f"{root}/{relative}"
        expected = (local / relative).stat().st_size
        found = fs.size(remote) if fs.exists(remote) else None
        if found != expected:
            raise ExportError(
                f"after the upload {remote!r} has {found} bytes, expected {expected}; the ensemble"
                " was not published (its config.pbtxt goes up last), so run the export again"
            )
