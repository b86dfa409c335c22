"""Cutting a plan into Triton steps: each libtorch operator is a model of its own (with the TopK
that ranks its scores, the decoding of its ids and the blanking of filtered rows compiled into it,
see ``fusion``), and python
operators are fused into as few python-backend models as the data flow allows (each model is one
hop through a python stub, so fewer models answer faster)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from merlin.schema import Schema

from merlin_torch_serving.exceptions import ExportError
from merlin_torch_serving.export.fusion import fusable_blank, fusable_decode, fusable_top_k
from merlin_torch_serving.plan import REQUEST, OpCall, Plan, Ref


@dataclass
class Step:
    """One Triton model of the ensemble.

    ``inputs`` and ``outputs`` map the model's column names (before wire expansion) to the refs
    they carry; names are the refs' column names, qualified only when two refs share one.
    """

    index: int
    name: str
    backend: str
    calls: list[OpCall]
    inputs: dict[str, Ref] = field(default_factory=dict)
    outputs: dict[str, Ref] = field(default_factory=dict)
    input_schema: Schema = field(default_factory=Schema)
    output_schema: Schema = field(default_factory=Schema)

    @property
    def call_indices(self) -> set[int]:
        return {call.index for call in self.calls}


def partition(plan: Plan, ensemble_name: str) -> list[Step]:
    """Assign every call to a step, then derive each step's inputs and outputs."""
    groups: list[tuple[str, list[OpCall]]] = []
    step_of_call: dict[int, int] = {}
    calls_by_index = {call.index: call for call in plan.calls}
    consumers = _consumer_counts(plan)
    for call in plan.calls:
        producer_steps = [
            step_of_call[ref.producer] for ref in call.inputs.values() if ref.producer != REQUEST
        ]
        earliest = max(producer_steps, default=0)
        target = None
        first_producer = calls_by_index.get(
            next(iter(call.inputs.values()), Ref(REQUEST, "")).producer
        )
        producer_backend = groups[step_of_call[first_producer.index]][0] if first_producer else None
        if first_producer is not None and (
            fusable_top_k(call, first_producer, step_of_call, consumers)
            or fusable_decode(call, first_producer, producer_backend, consumers)
            or fusable_blank(call, first_producer, producer_backend, consumers, step_of_call)
        ):
            target = step_of_call[first_producer.index]
        elif call.op.backend == "python":
            # any python step at or after the last producer's step already has the inputs ready
            target = next(
                (i for i in range(earliest, len(groups)) if groups[i][0] == "python"), None
            )
        if target is None:
            groups.append((call.op.backend, []))
            target = len(groups) - 1
        groups[target][1].append(call)
        step_of_call[call.index] = target

    for name, ref in plan.outputs.items():
        if ref.producer == REQUEST:
            raise ExportError(
                f"output column {name!r} is a request column passed straight through; Triton "
                "ensembles cannot route an input to an output. Take it from an operator's output "
                "instead (e.g. the workflow's output)"
            )

    steps = [
        Step(index=i, name=_step_name(ensemble_name, i, calls), backend=backend, calls=calls)
        for i, (backend, calls) in enumerate(groups)
    ]
    consumed_by: dict[Ref, set[int]] = {}
    for step in steps:
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


def _consumer_counts(plan: Plan) -> dict[Ref, int]:
    """How many calls (and ensemble outputs) read each ref."""
    counts: dict[Ref, int] = {}
    for ref in [ref for call in plan.calls for ref in call.inputs.values()] + list(
        plan.outputs.values()
    ):
        counts[ref] = counts.get(ref, 0) + 1
    return counts


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
