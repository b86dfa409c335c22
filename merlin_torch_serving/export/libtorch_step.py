"""A libtorch step's model file and config: an AOTInductor package (``model.pt2``, compiled ahead of
time, see ``aot``) where the step can be one, else TorchScript (``model.pt``, the operators'
TorchScript forms chained by ``fusion``), each checked as Triton's pytorch backend will call it.

In a batched export a package step answers one request at a time in the batched wire form (a
package of its own, compiled with the leading 1 of that form); merging requests across a batch
(``libtorch_batching``) is TorchScript's alone so far.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.aot.package import CompiledPackage
from merlin_torch_serving.aot.steps import StepForm, step_form
from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import ExportError, ModelCheckError, PackageError
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export import merging
from merlin_torch_serving.export.checks import (
    check_libtorch_model,
    check_libtorch_return_type,
    check_libtorch_schemas,
)
from merlin_torch_serving.export.fusion import libtorch_module
from merlin_torch_serving.export.libtorch_batching import flat_batch, merged_requests
from merlin_torch_serving.export.partition import TritonStep
from merlin_torch_serving.export.request_dim import with_request_dim
from merlin_torch_serving.export.warmup_files import WARMUP_DIR, write_warmup_arrays

PACKAGE_FILE = "model.pt2"


def libtorch_forms(
    steps: list[TritonStep], options: configs.ModelOptions, *, packages: bool = True
) -> dict[str, StepForm]:
    """How each libtorch step of ``steps`` is compiled (``aot.steps.step_form``, the same decision
    and package in-process runs use); with ``packages`` off (a route's branches, which in-process
    runs call operator by operator) every one stays TorchScript."""
    forms = {}
    for step in steps:
        if step.backend != "pytorch":
            continue
        if not packages:
            required = [call.op.label for call in step.calls if call.op.requires_package]
            if required:
                raise ExportError(
                    f"{', '.join(required)} asked for an AOTInductor package, but a libtorch step"
                    " inside a route's branch is TorchScript; pass compiled='torchscript' (or"
                    " 'auto') there"
                )
            forms[step.name] = StepForm(None, "TorchScript: a step of a route's branch")
            continue
        try:
            forms[step.name] = step_form(
                step, instruction_set_name=options.instruction_set, threads=options.torch_threads
            )
        except PackageError as error:
            raise ExportError(f"libtorch step {step.name!r}: {error}") from error
    return forms


def fallback_notes(forms: dict[str, StepForm]) -> list[str]:
    """The export's warnings for steps that stay TorchScript after a package was tried."""
    return [
        f"libtorch step {name!r} stays TorchScript: {form.note}"
        for name, form in forms.items()
        if form.tried
    ]


def unmerged_reasons(packaged: set[str]) -> dict[str, str]:
    """Why each package step of a batched export answers one request at a time."""
    return dict.fromkeys(packaged, "AOTInductor packages do not merge a batch's requests yet")


def compiled_record(step: TritonStep, forms: dict[str, StepForm]) -> dict:
    """A libtorch step's record of what it is: a package or TorchScript, and why."""
    form = forms.get(step.name)
    if step.backend != "pytorch" or form is None:
        return {}
    return {"compiled": "package" if form.package else "torchscript", "compiled_note": form.note}


def write_libtorch_step(
    model_dir: Path,
    step: TritonStep,
    version: int,
    options: configs.ModelOptions,
    warmup: tuple[dict, dict],
    form: StepForm | None,
    merged: bool = False,
    session_key: str | None = None,
) -> model_config_pb2.ModelConfig:
    """Write the step's model into ``model_dir``/``version`` and return its config; ``warmup``: its
    warm-up files and arrays; ``merged``, ``session_key`` as ``repository._write_step`` says."""
    check_libtorch_schemas(step.name, step.input_schema, step.output_schema)
    version_dir = model_dir / str(version)
    warmup_files, warmup_arrays = warmup
    if form is not None and form.package is not None:
        return _write_package(version_dir, step, options, warmup_files, warmup_arrays, form)
    module = libtorch_module(step)
    check_libtorch_return_type(step.name, module)
    outputs = len(wire.schema_specs(step.output_schema))
    if merged:
        module = merged_requests(module, step.input_schema, outputs, session_key or "")
        sessions = None if session_key is None else len(np.unique(warmup_arrays[session_key]))
        sent = merging.padded_for_libtorch(warmup_arrays, sessions)
        warmup_files = write_warmup_arrays(model_dir / WARMUP_DIR, sent)
        warmup_arrays = flat_batch([warmup_arrays, warmup_arrays], session_key)
    elif options.batching:
        module = with_request_dim(module, step.name, outputs)
        warmup_arrays = {name: array[np.newaxis] for name, array in warmup_arrays.items()}
    torch.jit.save(module, str(version_dir / configs.LIBTORCH_MODEL_FILE))
    config = configs.pytorch_model_config(
        step.name, step.input_schema, step.output_schema, options, warmup_files, merged
    )
    check_libtorch_model(
        step.name, version_dir / configs.LIBTORCH_MODEL_FILE, config, warmup_arrays
    )
    return config


def _write_package(
    version_dir: Path,
    step: TritonStep,
    options: configs.ModelOptions,
    warmup_files: dict,
    warmup_arrays: dict,
    form: StepForm,
) -> model_config_pb2.ModelConfig:
    if options.batching:  # the package of the batched form, compiled alike
        form = step_form(
            step,
            instruction_set_name=options.instruction_set,
            threads=options.torch_threads,
            request_dim=True,
        )
        warmup_arrays = {name: array[np.newaxis] for name, array in warmup_arrays.items()}
    if form.package is None:
        raise ExportError(f"libtorch step {step.name!r}: {form.note}")
    shutil.copy2(form.package.path, version_dir / PACKAGE_FILE)
    config = configs.pytorch_model_config(
        step.name,
        step.input_schema,
        step.output_schema,
        options,
        warmup_files,
        model_file=PACKAGE_FILE,
    )
    check_package(step.name, version_dir / PACKAGE_FILE, config, warmup_arrays)
    return config


def check_package(
    model_name: str, path: Path, config: model_config_pb2.ModelConfig, arrays: dict
) -> None:
    """Call the package as the backend will (its config's inputs by name) on ``arrays`` and raise
    ``ModelCheckError`` where its inputs or outputs disagree with ``config``."""
    package = CompiledPackage(path, model_name)
    declared = [tensor.name for tensor in config.input]
    if sorted(declared) != sorted(package.input_names):
        raise ModelCheckError(
            model_name,
            None,
            f"a package taking the config's inputs {declared}",
            f"one taking {package.input_names}",
        )
    inputs = {
        name: torch.from_numpy(np.ascontiguousarray(arrays[name])) for name in package.input_names
    }
    try:
        outputs = package(inputs)
    except Exception as error:
        raise ModelCheckError(
            model_name, None, "a successful call on its warm-up request", f"{error}"
        ) from error
    if len(outputs) != len(config.output):
        raise ModelCheckError(
            model_name, None, f"{len(config.output)} output(s)", f"{len(outputs)}"
        )
    for spec, tensor in zip(config.output, outputs, strict=True):
        want = wire.numpy_dtype(model_config_pb2.DataType.Name(spec.data_type))
        dims = list(spec.dims)
        shape = list(tensor.shape)
        if (
            wire.tensor_numpy_dtype(tensor.dtype) != want
            or len(dims) != len(shape)
            or any(d not in (-1, s) for d, s in zip(dims, shape, strict=True))
        ):
            raise ModelCheckError(
                model_name,
                f"output {spec.name!r}",
                f"{want} of dims {dims}",
                f"{tensor.dtype} of shape {shape}",
            )
