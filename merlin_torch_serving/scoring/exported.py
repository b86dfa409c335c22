"""An exported ensemble loaded in this process from its repository's files, and run as tritonserver
runs it: every file checked against the manifest first, then each step in the ensemble's order,
tensors routed by the ensemble config's input and output maps (see ``steps`` for how each step is
called). Scoring runs exactly what a server of that repository answers, without a server.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.client.model_schemas import ModelSchemas, schemas_from_config
from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import ArtifactError
from merlin_torch_serving.export.config import PADDED_SUFFIX, ROWS_TENSOR, from_pbtxt
from merlin_torch_serving.export.manifest import MANIFEST_FILE, verify_export
from merlin_torch_serving.scoring.steps import load_step

CONFIG_FILE = "config.pbtxt"


@dataclass(frozen=True)
class Export:
    """An ensemble's export, its files checked against its manifest: what it takes and returns
    (``schemas``, as ``Client`` reads them from a server) and its ``digest``."""

    repository: Path
    name: str
    version: int
    digest: str
    schemas: ModelSchemas
    config: Any  # the ensemble's parsed config.pbtxt


def read_export(repository: str | os.PathLike, name: str | None = None) -> Export:
    """Ensemble ``name`` of the repository at ``repository`` (its newest version), once its files
    match the manifest (``ArtifactError`` otherwise). ``name`` may be left out when the repository
    holds one ensemble exported by this library."""
    folder = Path(repository).absolute()
    name = name or only_ensemble(folder)
    version = newest_version(folder, name)
    verify_export(folder, name, version)
    config = _read_config(folder / name)
    schemas = schemas_from_config(
        json_format.MessageToDict(config, preserving_proto_field_name=True)
    )
    return Export(folder, name, version, export_digest(folder, name), schemas, config)


class ExportedEnsemble:
    """An exported ensemble (see ``read_export``) with its steps loaded, run as a server runs it."""

    def __init__(self, repository: str | os.PathLike, name: str | None = None):
        self.export = read_export(repository, name)
        self.schemas = self.export.schemas
        self.digest = self.export.digest
        scheduled = self.export.config.ensemble_scheduling.step
        self.steps = [
            load_step(
                self.export.repository / step.model_name,
                step.model_version if step.model_version > 0 else self.export.version,
                _read_config(self.export.repository / step.model_name),
                request_dim=self.schemas.request_dim,
            )
            for step in scheduled
        ]
        self.maps = [
            (_routed(dict(step.input_map)), _routed(dict(step.output_map))) for step in scheduled
        ]

    @property
    def input_schema(self) -> Schema:
        return self.schemas.input_schema

    @property
    def output_schema(self) -> Schema:
        return self.schemas.output_schema

    def run(self, request: TensorTable) -> TensorTable:
        """The ensemble's answer to a request table (columns of its input schema), as a table of
        its output schema: what ``Client.infer_table`` returns from a server of this repository."""
        tensors = wire.to_wire(request)
        for step, (input_map, output_map) in zip(self.steps, self.maps, strict=True):
            outputs = step.run({model: tensors[tensor] for model, tensor in input_map.items()})
            for model, tensor in output_map.items():
                tensors[tensor] = outputs[model]
        arrays: dict[str, np.ndarray] = {}
        for column in self.output_schema:
            sent = self.schemas.response_names[column.name]
            for spec in wire.column_specs(column):
                arrays[spec.name] = tensors[sent + spec.name[len(column.name) :]]
        return wire.from_wire(arrays, self.output_schema)


def export_digest(repository: str | os.PathLike, name: str) -> str:
    """sha256 of ensemble ``name``'s manifest (which holds the sha256 of every step file) and of
    every config of the ensemble and its steps (threads, row limits, batching): two repositories
    with the same digest give the same answers."""
    repository = Path(repository)
    version = newest_version(repository, name)
    digest = hashlib.sha256((repository / name / str(version) / MANIFEST_FILE).read_bytes())
    config = _read_config(repository / name)
    for model in [name, *(step.model_name for step in config.ensemble_scheduling.step)]:
        digest.update(model.encode())
        digest.update((repository / model / CONFIG_FILE).read_bytes())
    return digest.hexdigest()


def only_ensemble(repository: Path) -> str:
    """The name of the one ensemble exported into ``repository``; an ``ArtifactError`` listing them
    when there are none or several."""
    if not repository.is_dir():
        raise ArtifactError(
            str(repository),
            "no such folder",
            "pass the folder Ensemble.export wrote into",
            "repository",
        )
    found = sorted(
        folder.name
        for folder in repository.iterdir()
        if (folder / CONFIG_FILE).is_file() and any(folder.glob(f"*/{MANIFEST_FILE}"))
    )
    if len(found) == 1:
        return found[0]
    if not found:
        raise ArtifactError(
            str(repository),
            "it holds no ensemble exported by merlin-torch-serving (no <name>/<version>/"
            f"{MANIFEST_FILE})",
            "pass the folder Ensemble.export wrote into",
            "repository",
        )
    raise ArtifactError(
        str(repository),
        f"it holds {len(found)} ensembles ({', '.join(map(repr, found))})",
        "name the one to score (name=..., --name)",
        "repository",
    )


def newest_version(repository: Path, name: str) -> int:
    folder = Path(repository) / name
    versions = (
        [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    )
    if not versions:
        raise ArtifactError(
            name,
            f"{str(folder)!r} holds no version folder",
            f"export the ensemble into {str(repository)!r} first, or name one it holds",
            "ensemble",
        )
    return max(versions)


def _read_config(model_dir: Path):
    try:
        return from_pbtxt((model_dir / CONFIG_FILE).read_text())
    except OSError as error:
        raise ArtifactError(
            model_dir.name, f"its {CONFIG_FILE} cannot be read ({error})", "re-export the ensemble"
        ) from error


def _routed(tensor_map: dict[str, str]) -> dict[str, str]:
    """A step's map (step tensor -> ensemble tensor) as tensors travel in this process: a batched
    libtorch step's padded tensors and row counts (what Triton's batcher needs; see
    ``export.libtorch_batching``) are made from the plain tensors by the step itself."""
    routed = {}
    for model, tensor in tensor_map.items():
        if model == ROWS_TENSOR:
            continue
        routed[model.removesuffix(PADDED_SUFFIX)] = tensor.removesuffix(PADDED_SUFFIX)
    return routed
