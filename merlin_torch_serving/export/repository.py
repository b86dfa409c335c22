"""Writing an ensemble as a Triton model repository, atomically.

Layout (``N`` is the version)::

    <repository>/
      <name>-0-<operators>/   config.pbtxt, warmup/, N/{model.py, step.json, ops/<i>/...}  (python)
      <name>-1-<operators>/   config.pbtxt, warmup/, N/model.pt2 or model.pt              (libtorch)
      <name>/                 config.pbtxt (platform "ensemble"), N/manifest.json

Steps are named after the operators they host, and written through the operators' contract only
(``ops.base``): a python step records each operator's class, ``config()`` and artifacts in
``step.json``; a libtorch step is the AOTInductor package its operators compile into, else their
TorchScript (``libtorch_step``).

Everything is written into a staging folder beside the repository and swapped in at the end in
one atomic step (see ``swap``): a failed or killed export leaves the repository exactly as it was,
and a tritonserver polling it sees the old tree or the new one, never a part. Models of the
repository that this ensemble does not own are kept. Every failure is an ``ExportError`` whose
cause is chained.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import schema_to_json
from merlin_torch_serving.exceptions import ExportError, RepositoryExistsError
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export import manifest, swap
from merlin_torch_serving.export.checks import warn_about_differing_thread_counts
from merlin_torch_serving.export.config import PADDED_SUFFIX, ROWS_TENSOR
from merlin_torch_serving.export.ensemble_wiring import ensemble_model_config
from merlin_torch_serving.export.libtorch_batching import fed_tensors, row_sources, unmerged_steps
from merlin_torch_serving.export.libtorch_feeder import (
    Feeder,
    ensemble_step,
    request_feeders,
    write_feeder,
)
from merlin_torch_serving.export.libtorch_step import (
    compiled_record,
    fallback_notes,
    libtorch_forms,
    unmerged_reasons,
    write_libtorch_step,
)
from merlin_torch_serving.export.manifest import MANIFEST_FILE
from merlin_torch_serving.export.partition import TritonStep, partition, placement_notes
from merlin_torch_serving.export.python_step import write_python_step
from merlin_torch_serving.export.sub_ensembles import (
    manifest_record,
    sub_ensembles,
    sub_graphs_of,
    write_sub_ensembles,
)
from merlin_torch_serving.export.warmup import warmup_inputs, write_ensemble_sample
from merlin_torch_serving.export.warmup_files import WARMUP_DIR, write_warmup_files
from merlin_torch_serving.graph.plan import Plan

if TYPE_CHECKING:
    from merlin_torch_serving.aot.steps import StepForm

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PYTHON_MODEL_SOURCE = '''"""A merlin_torch_serving step, run by Triton's python backend."""

from merlin_torch_serving.export.stub import TritonPythonModel  # noqa: F401
'''
_LIBRARIES = (
    "merlin-torch-serving",
    "merlin-core",
    "nvtabular",
    "torch",
    "tritonclient",
    "numpy",
    "pandas",
    "transformers4rec",
)


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the ensemble model to query and every model behind it."""

    path: str
    name: str
    version: int
    models: list[str]
    fused: dict[str, list[str]] = field(default_factory=dict)  # step model -> operators it hosts
    warnings: list[str] = field(default_factory=list)  # e.g. a filter no warm-up request passed


def export_ensemble(
    ensemble,
    path: str | os.PathLike,
    name: str,
    *,
    overwrite: bool = False,
    add_version: bool = False,
    options: configs.ModelOptions = configs.ModelOptions(),
) -> ExportResult:
    """Write ``ensemble`` into the repository at ``path`` as the Triton ensemble ``name``.

    An existing model of the same name is an error unless ``overwrite`` (replace it and the step
    models its previous export wrote: the new export becomes version 1) or ``add_version`` (write
    version N+1 beside version N; configs describe the newest version).
    """
    if not _MODEL_NAME.match(name):
        raise ExportError(
            f"ensemble name {name!r} is not a valid Triton model name (letters, digits, '-', '_',"
            " '.')"
        )
    if overwrite and add_version:
        raise ExportError("pass either overwrite=True or add_version=True, not both")
    repository = Path(path).absolute()
    plan: Plan = ensemble.plan
    steps = partition(plan, name)
    feeders = request_feeders(plan, steps) if options.batching else []
    feeder_names = [feeder.name for feeder in feeders]
    # the sub-graphs of its operators (a route's branches), as ensembles of their own
    subs = sub_ensembles(plan, name)
    model_names = (
        feeder_names
        + [step.name for step in steps]
        + [model for sub in subs for model in sub.models]
        + [name]
    )
    existing = [model for model in model_names if (repository / model).exists()]
    if overwrite:
        # steps of the previous export that this one does not write again (say, a step that moved
        # to another backend) would otherwise stay behind, loaded by servers for nothing
        existing += [
            model for model in _previous_steps(repository / name) if model not in model_names
        ]
    version = 1
    if existing and add_version:
        version = 1 + max(max(_versions(repository / model)) for model in existing)
    elif existing and not overwrite:
        raise RepositoryExistsError(str(repository), existing)
    # package or TorchScript, per libtorch step: packages are compiled here (or found in the cache)
    forms = libtorch_forms(steps, options)
    for sub in subs:  # refuses a package asked for inside a route's branch
        libtorch_forms(sub.steps, options, packages=False)
    packaged = {step_name for step_name, form in forms.items() if form.package is not None}
    unfed = {feeder.name for feeder in feeders if feeder.step in packaged}
    feeders = [feeder for feeder in feeders if feeder.name not in unfed]  # a package takes
    model_names = [model for model in model_names if model not in unfed]  # one request at a time

    doing = "preparing the staging folder"
    staging = None
    try:
        swap.recover(repository)
        staging = swap.staging_folder(repository)
        staged = staging / swap.STAGED_DIR
        if repository.exists():
            doing = "copying the current repository into the staging folder"
            _copy_tree(repository, staged, skip=[] if add_version else existing)
        staged.mkdir(exist_ok=True)
        # batched: libtorch step -> the python step that tells it each request's rows, or the
        # libtorch model that does for a step reading the request (libtorch_feeder)
        rows_from = {
            step_name: source
            for step_name, source in (row_sources(steps) if options.batching else {}).items()
            if step_name not in packaged
        }
        feeds = fed_tensors(steps, rows_from)
        rows_from.update({feeder.step: feeder.name for feeder in feeders})
        session_keys = {feeder.step: feeder.key for feeder in feeders}
        doing = "building the warm-up requests"
        warmup = warmup_inputs(plan, steps)
        for feeder in feeders:
            doing = f"writing the session feeder {feeder.name!r}"
            write_feeder(staged / feeder.name, feeder, version, options, warmup.arrays[feeder.step])
        for step in steps:
            doing = (
                f"writing step {step.name!r} ({', '.join(call.op.label for call in step.calls)})"
            )
            _write_step(
                staged / step.name,
                step,
                version,
                options,
                warmup.arrays[step.name],
                merged=step.name in rows_from,
                feeds=feeds.get(step.name),
                session_key=session_keys.get(step.name),
                sub_graphs=sub_graphs_of(subs, name),
                form=forms.get(step.name),
            )
        doing = "writing the sub-graphs of its operators as ensembles"
        write_sub_ensembles(
            subs, staged, version, options, (name, plan, warmup), _write_step, _write_ensemble
        )
        doing = f"writing the ensemble {name!r}"
        _write_ensemble(
            staged / name,
            version,
            ensemble_model_config(
                name,
                ensemble,
                plan,
                steps,
                options,
                rows_from,
                feeds,
                [ensemble_step(feeder) for feeder in feeders],
            ),
        )
        write_ensemble_sample(staged / name, plan, warmup, options.warmup_count, options.batching)
        _write_manifest(
            staged / name / str(version) / MANIFEST_FILE,
            name,
            version,
            ensemble,
            steps + [step for sub in subs if not sub.inline for step in sub.steps],
            options,
            warmup.problem,
            staged,
            feeders,
            manifest_record(subs),
            forms,
        )
        warn_about_differing_thread_counts(staged)
        doing = "putting the new repository in place of the old one"
        swap.replace_tree(staging, repository)
    except ExportError:
        raise
    except Exception as error:
        raise ExportError(
            f"exporting ensemble {name!r} to {str(repository)!r} failed while {doing}: "
            f"{type(error).__name__}: {error}; the repository was left as it was"
        ) from error
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(
        path=str(repository),
        name=name,
        version=version,
        models=model_names,
        fused={
            step.name: [call.op.label for call in step.calls]
            for step in steps + [step for sub in subs if not sub.inline for step in sub.steps]
        },
        warnings=([warmup.problem] if warmup.problem else [])
        + placement_notes(plan)
        + fallback_notes(forms)
        + (
            unmerged_steps(steps, rows_from, unmerged_reasons(packaged)) if options.batching else []
        ),
    )


# ---- steps ---------------------------------------------------------------------------------------


def _write_step(
    model_dir: Path,
    step: TritonStep,
    version: int,
    options: configs.ModelOptions,
    warmup_arrays: dict,
    merged: bool = False,
    feeds: list[wire.TensorSpec] | None = None,
    session_key: str | None = None,
    sub_graphs: dict | None = None,
    form: StepForm | None = None,
) -> None:
    """``merged``: a libtorch step that answers a batch of requests at once; ``feeds``: the outputs
    of a python step that such a step reads (see libtorch_batching.py); ``session_key``: the
    request's session id, for a merged step that reads the request (libtorch_feeder.py);
    ``sub_graphs``: by call index, what the export made of the call's sub-graphs (see
    sub_ensembles.py); ``form``: a libtorch step's package, if it is one (libtorch_step.py)."""
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True)
    warmup_files = write_warmup_files(model_dir / WARMUP_DIR, step.input_schema, warmup_arrays)
    if step.backend == "pytorch":
        config = write_libtorch_step(
            model_dir,
            step,
            version,
            options,
            (warmup_files, warmup_arrays),
            form,
            merged,
            session_key,
        )
    else:
        write_python_step(
            version_dir,
            step,
            sub_graphs,
            _PYTHON_MODEL_SOURCE,
            request_dim=options.batching,
            version=version,
        )
        config = configs.python_model_config(
            step.name,
            step.input_schema,
            step.output_schema,
            options,
            warmup_files,
            feeds or [],
            [service for call in step.calls for service in call.op.services()],
        )
        if any(call.op.reloadable_config for call in step.calls):
            # the exported settings until new ones are written here (routing.weights)
            _write_text(model_dir / configs.CONFIG_OVERRIDES_FILE, "{}\n")
    _write_text(model_dir / "config.pbtxt", configs.to_pbtxt(config))


# ---- ensemble ------------------------------------------------------------------------------------


def _write_ensemble(model_dir: Path, version: int, config) -> None:
    (model_dir / str(version)).mkdir(parents=True)
    _write_text(model_dir / "config.pbtxt", configs.to_pbtxt(config))


def _write_manifest(
    path: Path,
    name: str,
    version: int,
    ensemble,
    steps: list[TritonStep],
    options,
    warmup_problem: str | None,
    staged: Path,
    feeders: list[Feeder],
    sub_graphs: dict | None = None,
    forms: dict[str, StepForm] | None = None,
) -> None:
    record = {
        "ensemble": name,
        "version": version,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "format_version": manifest.STEP_FORMAT_VERSION,
        "library_version": manifest.library_version(),
        "python": sys.version.split()[0],
        "libraries": {lib: _version(lib) for lib in _LIBRARIES},
        "model_options": dataclasses.asdict(options),
        "warmup": {"passes_filters": warmup_problem is None, "problem": warmup_problem},
        "input_schema": json.loads(schema_to_json(ensemble.input_schema)),
        "output_schema": json.loads(schema_to_json(ensemble.output_schema)),
        "steps": [
            {
                "model": step.name,
                "backend": step.backend,
                "fused_operators": [call.op.label for call in step.calls],
                "operators": [
                    {
                        "label": call.op.label,
                        "class": call.op.class_path,
                        "format_version": call.op.format_version,
                        "parameters": call.op.config(),
                    }
                    for call in step.calls
                ],
                **compiled_record(step, forms or {}),
                "inputs": [spec.name for spec in wire.schema_specs(step.input_schema)],
                "outputs": [spec.name for spec in wire.schema_specs(step.output_schema)],
                "artifacts": manifest.file_digests(staged / step.name / str(version)),
            }
            for step in steps
        ],
        "sub_ensembles": sub_graphs or {},
    }
    record["steps"][:0] = [
        {
            "model": feeder.name,
            "backend": "pytorch",
            "fused_operators": [],
            "operators": [],
            "feeds": feeder.step,
            "inputs": [spec.name for spec in feeder.tensors],
            "outputs": [ROWS_TENSOR] + [spec.name + PADDED_SUFFIX for spec in feeder.tensors],
            "artifacts": manifest.file_digests(staged / feeder.name / str(version)),
        }
        for feeder in feeders
    ]
    _write_text(path, json.dumps(record, indent=1))


# ---- files ---------------------------------------------------------------------------------------


def _previous_steps(ensemble_dir: Path) -> list[str]:
    """The step models the newest export of the ensemble in ``ensemble_dir`` wrote.

    They are read from its manifest.
    """
    record = (
        ensemble_dir / str(max(_versions(ensemble_dir))) / MANIFEST_FILE
        if ensemble_dir.is_dir()
        else None
    )
    if record is None or not record.is_file():
        return []
    written = json.loads(record.read_text())
    models = [step["model"] for step in written.get("steps", [])] + list(
        written.get("sub_ensembles", {})
    )
    return [model for model in models if (ensemble_dir.parent / model).is_dir()]


def _versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()) or [
        0
    ]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _write_text(path: Path, text: str) -> None:
    # a file copied from the live repository is replaced, not written into
    if path.exists():
        path.unlink()
    path.write_text(text)


def _copy_tree(source: Path, target: Path, skip: list[str]) -> None:
    """Copy the repository, but the top-level model folders in ``skip``.

    Copies, not hard links: linking a file changes its change time, and a tritonserver polling
    the live repository would take that for a new version of every model in it and reload them
    all while the export is still being written (and again when the old tree is deleted). With
    copies the live tree is left untouched, and the models are reloaded once, after the swap,
    together with the new ones."""
    shutil.copytree(
        source,
        target,
        symlinks=True,
        ignore=lambda folder, names: skip if Path(folder) == source else [],
    )
