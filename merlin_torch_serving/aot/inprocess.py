"""A plan run in this process as it is served: step by step as the export cuts it, each libtorch
step that the export compiles into a package run as that very package (``steps.step_form``), every
other operator as usual. Served answers then equal in-process answers bit for bit.

The executors call ``run``; a plan without such a step (or that cannot be cut into steps) runs
call by call, as it always has.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving.aot.compiling import reason
from merlin_torch_serving.aot.package import CompiledPackage
from merlin_torch_serving.aot.steps import StepModule, step_form, step_label, tensors
from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import ExportError, InferenceError, InputError
from merlin_torch_serving.export.partition import TritonStep, partition
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.graph.plan import REQUEST, Plan, Ref, run_calls


class Packaged(NamedTuple):
    package: CompiledPackage
    module: StepModule


def run(
    plan: Plan, request: TensorTable, *, threads: int | None, instruction_set_name: str
) -> TensorTable:
    """``plan`` on ``request``, with its packages for that thread count and instruction set."""
    key = ("packaged", threads, instruction_set_name)
    if key not in plan.runs:
        plan.runs[key] = _packaged_steps(plan, threads, instruction_set_name)
    steps = plan.runs[key]
    if steps is None:
        return plan.run(request)
    env = {Ref(REQUEST, name): column for name, column in request.items()}
    for step, packaged in steps:
        if packaged is None:
            run_calls(step.calls, env, {})
        else:
            _run_package(step, packaged, env)
    return TensorTable({name: env[ref] for name, ref in plan.outputs.items()}, _unsafe=True)


def _packaged_steps(
    plan: Plan, threads: int | None, instruction_set_name: str
) -> list[tuple[TritonStep, Packaged | None]] | None:
    """The plan's steps in the order a server runs them, each libtorch step with its package; None
    when no step is a package."""
    try:
        steps = partition(plan, "in-process")
    except ExportError:  # a plan no server could run: it runs call by call
        return None
    forms: list[tuple[TritonStep, Packaged | None]] = []
    for step in steps:
        packaged = None
        if step.backend == "pytorch":
            form = step_form(step, instruction_set_name=instruction_set_name, threads=threads)
            if form.package is not None and form.module is not None:
                packaged = Packaged(form.package, form.module)
        forms.append((step, packaged))
    return forms if any(packaged is not None for _, packaged in forms) else None


def _run_package(step: TritonStep, packaged: Packaged, env: dict) -> None:
    """Step ``step``'s package on its inputs from ``env``; its outputs go into ``env``."""
    label = step_label(step)
    inputs = tensors(
        wire.to_wire(
            TensorTable({name: env[ref] for name, ref in step.inputs.items()}, _unsafe=True)
        )
    )
    started = time.perf_counter()
    try:
        packaged.module.check(inputs)
        outputs = packaged.package(inputs)
    except InputError:
        raise
    except (RuntimeError, ValueError) as error:
        refused = InputError.from_message(str(error).strip().splitlines()[-1])
        if refused is not None:
            raise refused from None
        raise InferenceError(label, reason(error)) from error
    metrics.count(metrics.OPERATOR_SECONDS, time.perf_counter() - started, operator=label)
    specs = wire.schema_specs(step.output_schema)
    arrays = {
        spec.name: np.asarray(tensor.numpy()) for spec, tensor in zip(specs, outputs, strict=True)
    }
    table = wire.from_wire(arrays, step.output_schema)
    for name, ref in step.outputs.items():
        env[ref] = table[name]
