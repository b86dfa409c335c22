"""The files of a python step: each operator's artifacts and ``step.json`` (how the step's
operators are wired, their configs, and the digests of every file), read back by
``python_model.HostedStep``. A sub-graph an operator hosts in its own step (a route's inline
branch) is such a step too, written into the operator's artifact folder."""

from __future__ import annotations

import importlib.util
import json
import py_compile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from merlin_torch_serving.data.schemas import schema_to_json
from merlin_torch_serving.export import manifest
from merlin_torch_serving.export.partition import TritonStep
from merlin_torch_serving.export.python_model import STEP_FILE
from merlin_torch_serving.ops.sub_models import write_sub_models

if TYPE_CHECKING:
    from merlin_torch_serving.export.sub_ensembles import SubEnsemble

INLINE_DIR = "sub_graphs"


def write_python_step(
    version_dir: Path,
    step: TritonStep,
    sub_graphs: dict[int, list[SubEnsemble]] | None = None,
    model_source: str | None = None,
    request_dim: bool = False,
    version: int = 0,
) -> None:
    """Write ``step`` into ``version_dir``: ``sub_graphs`` by call index (what the export made of
    each call's sub-graphs), ``model_source`` the ``model.py`` Triton imports (none for a step
    hosted in another), ``version`` the export's (recorded with the ensemble's name, for what the
    step's answers say about where they came from)."""
    spec: dict[str, Any] = {
        "ensemble": {"name": step.ensemble, "version": version},
        "inputs": {name: [ref.producer, ref.column] for name, ref in step.inputs.items()},
        "outputs": {name: [ref.producer, ref.column] for name, ref in step.outputs.items()},
        "input_schema": schema_to_json(step.input_schema),
        "output_schema": schema_to_json(step.output_schema),
        "calls": [],
    }
    for call in step.calls:
        artifacts = Path("ops") / str(call.index)
        folder = version_dir / artifacts
        folder.mkdir(parents=True)
        call.op.save_artifacts(str(folder))
        subs = (sub_graphs or {}).get(call.index, [])
        for sub in subs:
            if sub.inline:
                write_python_step(folder / INLINE_DIR / sub.key, sub.steps[0])
        if subs:
            write_sub_models(
                folder,
                {sub.key: sub.sub_model(request_dim, f"{INLINE_DIR}/{sub.key}") for sub in subs},
            )
        spec["calls"].append(
            {
                "index": call.index,
                "label": call.op.label,
                "class": call.op.class_path,
                "format_version": call.op.format_version,
                "config": call.op.config(),
                "artifacts": str(artifacts),
                "inputs": {name: [ref.producer, ref.column] for name, ref in call.inputs.items()},
                "input_schema": schema_to_json(call.input_schema),
                "output_schema": schema_to_json(call.output_schema),
            }
        )
    if model_source is not None:
        (version_dir / "model.py").write_text(model_source)
        _compile(version_dir / "model.py")
    spec.update(manifest.step_record(version_dir, exclude=[STEP_FILE]))
    (version_dir / STEP_FILE).write_text(json.dumps(spec, indent=1))


def _compile(source: Path) -> None:
    """Write the bytecode of ``source`` now: the stub would otherwise write it into the repository
    when it loads the model, and a polling tritonserver takes that change for a new model to reload.
    """
    py_compile.compile(
        str(source),
        cfile=importlib.util.cache_from_source(str(source)),
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        doraise=True,
    )
