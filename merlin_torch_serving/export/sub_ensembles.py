"""The sub-graphs of an ensemble's operators (a route's branches) as Triton ensembles of their own.

Triton's ensembles cannot branch, so a route cannot send sessions to one step or another inside
one ensemble; the python step that hosts the route calls each branch's ensemble through the python
backend's business logic scripting instead. Each sub-plan is cut into steps like the ensemble
itself (``partition``) and written beside it as ``<ensemble>.<branch>`` with its steps
``<ensemble>.<branch>-<i>-<operators>``; the operator finds its branches' models in
``sub_models.json`` of its artifact folder (``ops.sub_models``). Each branch is a model of its
own: it loads, reloads, scales and fails on its own, and the route answers the other sessions
when it is down.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from merlin.table import TensorTable

from merlin_torch_serving.exceptions import ExportError
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.ensemble_wiring import ensemble_model_config
from merlin_torch_serving.export.libtorch_batching import fed_tensors, row_sources
from merlin_torch_serving.export.partition import TritonStep, partition
from merlin_torch_serving.export.warmup import WarmupInputs, warmup_inputs
from merlin_torch_serving.graph.plan import Plan
from merlin_torch_serving.ops.sub_models import SubModel

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # as Triton model names are checked


@dataclass
class SubEnsemble:
    """One sub-graph of operator call ``call`` (in the plan of ``parent``) as an ensemble, or,
    ``inline``, as one python step inside the operator's own step."""

    name: str
    parent: str  # the ensemble (or sub-ensemble) whose step hosts the operator
    call: int
    key: str  # the sub-graph's name (a branch)
    plan: Plan
    steps: list[TritonStep]
    inline: bool = False

    @property
    def models(self) -> list[str]:
        """The Triton models written for it (none when it is inline)."""
        return [] if self.inline else [step.name for step in self.steps] + [self.name]

    def sub_model(self, request_dim: bool, inline_folder: str) -> SubModel:
        """What the served operator is told (``inline_folder``: where an inline one is written,
        relative to the operator's artifact folder)."""
        return SubModel(
            self.name,
            self.plan.input_schema,
            self.plan.output_schema,
            request_dim,
            inline_folder if self.inline else None,
        )


def sub_ensembles(plan: Plan, name: str) -> list[SubEnsemble]:
    """Every sub-graph of ``plan``'s calls, and of theirs, cut into steps."""
    found: list[SubEnsemble] = []
    for call in plan.calls:
        for key, sub_plan in call.sub_plans.items():
            sub_name = f"{name}.{key}"
            if not _MODEL_NAME.match(sub_name):
                raise ExportError(
                    f"the sub-graph {key!r} of {call.op.label} would be served as model"
                    f" {sub_name!r}, which is not a valid Triton model name; name it with letters,"
                    " digits, '-', '_' and '.'"
                )
            inline = key in call.op.inline_sub_graphs()
            steps = partition(sub_plan, sub_name)
            sub = SubEnsemble(sub_name, name, call.index, key, sub_plan, steps, inline)
            if inline:
                _check_inline(sub, call.op.label)
            found.append(sub)
            found.extend(sub_ensembles(sub_plan, sub_name))
    names = [model for sub in found for model in sub.models]
    repeated = sorted({model for model in names if names.count(model) > 1})
    if repeated:
        raise ExportError(
            f"two sub-graphs of ensemble {name!r} would be written as the same model(s)"
            f" {repeated}; give the branches of its routes names of their own"
        )
    return found


def sub_graphs_of(subs: list[SubEnsemble], parent: str) -> dict[int, list[SubEnsemble]]:
    """For each call of ``parent``'s plan that has sub-graphs: what the export makes of them."""
    found: dict[int, list[SubEnsemble]] = {}
    for sub in subs:
        if sub.parent == parent:
            found.setdefault(sub.call, []).append(sub)
    return found


def _check_inline(sub: SubEnsemble, operator: str) -> None:
    """An ``ExportError`` unless the sub-graph runs as one python step with no sub-graphs."""
    backends = [step.backend for step in sub.steps]
    if backends != ["python"] or any(call.sub_plans for call in sub.plan.calls):
        raise ExportError(
            f"{operator} hosts its sub-graph {sub.key!r} in its own python step, and that"
            f" sub-graph needs {len(backends)} step(s) on {', '.join(backends) or 'no backend'}"
            " (or has sub-graphs of its own); leave it out of inline so that it is served as a"
            " model of its own, or run its operators on the python backend"
        )


def write_sub_ensembles(
    subs: list[SubEnsemble],
    staged: Path,
    version: int,
    options: configs.ModelOptions,
    top: tuple[str, Plan, WarmupInputs],
    write_step: Callable,
    write_ensemble: Callable,
) -> None:
    """Write every sub-ensemble's steps and ensemble into ``staged`` (the repository being built):
    ``top`` is the ensemble's name, plan and warm-up; ``write_step`` and ``write_ensemble`` write a
    step and an ensemble as the ensemble's own are written (``repository``)."""
    name, plan, warmup = top
    warmups, plans = {name: warmup}, {name: plan}
    for sub in subs:  # each after the one whose operator calls it
        if sub.inline:  # written with the operator's step
            continue
        warmups[sub.name] = _warmup(sub, plans[sub.parent], warmups[sub.parent])
        plans[sub.name] = sub.plan
        rows_from = row_sources(sub.steps) if options.batching else {}
        feeds = fed_tensors(sub.steps, rows_from)
        for step in sub.steps:
            write_step(
                staged / step.name,
                step,
                version,
                options,
                warmups[sub.name].arrays[step.name],
                merged=step.name in rows_from,
                feeds=feeds.get(step.name),
                sub_graphs=sub_graphs_of(subs, sub.name),
            )
        write_ensemble(
            staged / sub.name,
            version,
            ensemble_model_config(
                sub.name, sub.plan, sub.plan, sub.steps, options, rows_from, feeds
            ),
        )


def _warmup(sub: SubEnsemble, parent_plan: Plan, parent_warmup: WarmupInputs) -> WarmupInputs:
    """Warm-up inputs of a sub-ensemble's steps: what its plan gets from the operator's input in
    the parent's warm-up run (all of its rows, whichever branch they went to)."""
    if parent_warmup.values is None:
        return warmup_inputs(sub.plan, sub.steps)
    call = parent_plan.calls[sub.call]
    request = TensorTable(
        {
            name: parent_warmup.values[call.inputs[name]]
            for name in sub.plan.input_schema.column_names
        },
        _unsafe=True,
    )
    return warmup_inputs(sub.plan, sub.steps, [request])


def manifest_record(subs: list[SubEnsemble]) -> dict:
    """What the manifest says of each sub-ensemble: whose operator calls it, and its steps."""
    records = {}
    for sub in subs:
        if sub.inline:
            continue
        records[sub.name] = {
            "operator": f"{sub.parent}:{sub.call}",
            "sub_graph": sub.key,
            "steps": [step.name for step in sub.steps],
        }
    return records
