"""Cutting a plan into Triton steps, knowing operators only through their contract
(``ops.base``): each ``"pytorch"`` operator starts a libtorch model, into which the later operators
that have a TorchScript form and read its outputs are compiled (see ``fusion``), and ``"python"``
operators are fused into as few python-backend models as the data flow allows (each model is one
hop through a python stub, so fewer models answer faster)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from merlin.schema import Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import ExportError
from merlin_torch_serving.export.checks import LIBTORCH_DTYPES
from merlin_torch_serving.graph.plan import REQUEST, OpCall, Plan, Ref
from merlin_torch_serving.ops.base import BACKENDS

if TYPE_CHECKING:
    import torch


@dataclass
class TritonStep:
    """One Triton model of the ensemble.

    ``inputs`` and ``outputs`` map the model's column names (before wire expansion) to the refs
    they carry; names are the refs' column names, qualified only when two refs share one. A libtorch
    step keeps each call's TorchScript form in ``torchscript`` (by call index).
    """

    index: int
    name: str
    backend: str
    calls: list[OpCall]
    inputs: dict[str, Ref] = field(default_factory=dict)
    outputs: dict[str, Ref] = field(default_factory=dict)
    input_schema: Schema = field(default_factory=Schema)
    output_schema: Schema = field(default_factory=Schema)
    torchscript: dict[int, torch.nn.Module] = field(default_factory=dict)
    #: the ensemble the step is a model of
    ensemble: str = ""

    @property
    def call_indices(self) -> set[int]:
        return {call.index for call in self.calls}


def partition(plan: Plan, ensemble_name: str) -> list[TritonStep]:
    """Assign every call to a step, then derive each step's inputs and outputs."""
    steps: list[TritonStep] = []
    step_of_call: dict[int, int] = {}
    readers = _readers(plan)
    for call in plan.calls:
        backend = call.op.backend
        if backend not in BACKENDS:
            raise ExportError(
                f"operator {call.op.label} declares backend {backend!r}; an operator runs on one of"
                f" {', '.join(BACKENDS)}"
            )
        producer_steps = [
            step_of_call[ref.producer] for ref in call.inputs.values() if ref.producer != REQUEST
        ]
        earliest = max(producer_steps, default=0)
        target, module = _libtorch_step_to_join(call, steps, step_of_call, readers, plan)
        if target is None and backend == "python":
            # any python step at or after the last producer's step already has the inputs ready
            target = next(
                (i for i in range(earliest, len(steps)) if steps[i].backend == "python"), None
            )
        if target is None:
            if backend == "pytorch":
                module = _libtorch_root(call)
            steps.append(TritonStep(index=len(steps), name="", backend=backend, calls=[]))
            target = len(steps) - 1
        steps[target].calls.append(call)
        if module is not None:
            steps[target].torchscript[call.index] = module
        step_of_call[call.index] = target

    for name, ref in plan.outputs.items():
        if ref.producer == REQUEST:
            raise ExportError(
                f"output column {name!r} is a request column passed straight through; Triton "
                "ensembles cannot route an input to an output. Take it from an operator's output "
                "instead (e.g. the workflow's output)"
            )

    consumed_by: dict[Ref, set[int]] = {}
    for step in steps:
        step.name = _step_name(ensemble_name, step.index, step.calls)
        step.ensemble = ensemble_name
        for call in step.calls:
            for ref in call.inputs.values():
                consumed_by.setdefault(ref, set()).add(step.index)
    final_refs = set(plan.outputs.values())

    for step in steps:
        own = step.call_indices
        external = [
            ref for call in step.calls for ref in call.inputs.values() if ref.producer not in own
        ]
        step.inputs = _named(_unique(external))
        produced = [
            Ref(call.index, name) for call in step.calls for name in call.output_schema.column_names
        ]
        exported = [
            ref
            for ref in produced
            if ref in final_refs or (consumed_by.get(ref, set()) - {step.index})
        ]
        step.outputs = _named(exported)
        step.input_schema = _schema(step.inputs, plan)
        step.output_schema = _schema(step.outputs, plan)
    return steps


def _libtorch_step_to_join(
    call: OpCall,
    steps: list[TritonStep],
    step_of_call: dict[int, int],
    readers: dict[Ref, list[OpCall | None]],
    plan: Plan,
) -> tuple[int | None, torch.nn.Module | None]:
    """The libtorch step ``call`` compiles into, with its TorchScript form; ``(None, None)`` if
    none.

    It joins the latest step it reads from when that is a libtorch step, what it takes from that
    step is read by nothing that needs it elsewhere (the scores of a whole catalog then never leave
    the model; see ``_stays_inside``), its other inputs come from the request or earlier steps,
    libtorch carries every tensor it reads and writes, and it has a TorchScript form for these
    inputs.
    """
    producer_steps = [
        step_of_call[ref.producer] for ref in call.inputs.values() if ref.producer != REQUEST
    ]
    if not producer_steps or steps[max(producer_steps)].backend != "pytorch":
        return None, None
    target = max(producer_steps)
    taken = [
        ref
        for ref in call.inputs.values()
        if ref.producer != REQUEST and step_of_call[ref.producer] == target
    ]
    if any(not _stays_inside(ref, call, readers, plan) for ref in taken):
        return None, None
    if not _libtorch_carries(call.input_schema) or not _libtorch_carries(
        call.output_schema, dense=True
    ):
        return None, None
    module = call.op.torchscript(call.input_schema)
    return (target, module) if module is not None else (None, None)


def _libtorch_root(call: OpCall) -> torch.nn.Module:
    """The TorchScript form of an operator that starts a libtorch step (ragged outputs come back
    as a ``Dict[str, Tensor]`` keyed by their wire tensors; see ``fusion``)."""
    module = call.op.torchscript(call.input_schema)
    if module is None:
        raise ExportError(
            f"operator {call.op.label} declares backend 'pytorch' but has no TorchScript form (its"
            " torchscript() returned None); Triton's pytorch backend runs TorchScript only"
        )
    return module


def placement_notes(plan: Plan) -> list[str]:
    """Why parts of operators run on another backend than they were asked to (see
    ``ServingOperator.placement_notes``), for the export's warnings."""
    return [note for call in plan.calls for note in call.op.placement_notes()]


def _stays_inside(
    ref: Ref, call: OpCall, readers: dict[Ref, list[OpCall | None]], plan: Plan
) -> bool:
    """Whether ``call`` may take ``ref`` into the libtorch step that makes it: every other reader
    of it is an operator with a TorchScript form (which can read it inside the step too), or the
    ensemble's output for a column its operator returns with every answer (the session id, the mark
    of filtered sessions). Scores read by anything else stay a step output of their own."""
    for reader in readers.get(ref, []):
        if reader is call:
            continue
        if reader is None:
            if ref.column not in plan.calls[ref.producer].op.returned_columns():
                return False
        elif reader.op.torchscript(reader.input_schema) is None:
            return False
    return True


def _libtorch_carries(schema: Schema, dense: bool = False) -> bool:
    """Whether Triton's pytorch backend carries every tensor of ``schema`` (and, with ``dense``, no
    column is a ragged list: a compiled operator's outputs are one tensor each)."""
    if dense and any(wire.is_ragged(column) for column in schema):
        return False
    try:
        return all(spec.triton_dtype in LIBTORCH_DTYPES for spec in wire.schema_specs(schema))
    except TypeError:  # a column without a Triton dtype
        return False


def _readers(plan: Plan) -> dict[Ref, list[OpCall | None]]:
    """The calls that read each ref, and None for each ensemble output that is it."""
    readers: dict[Ref, list[OpCall | None]] = {}
    for call in plan.calls:
        for ref in call.inputs.values():
            readers.setdefault(ref, []).append(call)
    for ref in plan.outputs.values():
        readers.setdefault(ref, []).append(None)
    return readers


def _step_name(ensemble_name: str, index: int, calls: list[OpCall]) -> str:
    slugs = []
    for call in calls:
        slug = re.sub(r"[^a-z0-9]+", "", call.op.export_name.lower())
        if slug not in slugs:
            slugs.append(slug)
    return f"{ensemble_name}-{index}-{'_'.join(slugs)}"


def _unique(refs: list[Ref]) -> list[Ref]:
    return list(dict.fromkeys(refs))


def _named(refs: list[Ref]) -> dict[str, Ref]:
    """Model-level names for refs: the column name, qualified by producer when it repeats."""
    counts: dict[str, int] = {}
    for ref in refs:
        counts[ref.column] = counts.get(ref.column, 0) + 1
    named = {}
    for ref in refs:
        source = "request" if ref.producer == REQUEST else f"op{ref.producer}"
        named[ref.column if counts[ref.column] == 1 else f"{ref.column}.{source}"] = ref
    return named


def _schema(named: dict[str, Ref], plan: Plan) -> Schema:
    return Schema([plan.schemas[ref].with_name(name) for name, ref in named.items()])
