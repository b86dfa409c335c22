"""Warm-up inputs of every exported step: what each step receives when the ensemble answers a
request that no filter drops, captured by running the plan in this process.

Operators that read the request propose candidate requests (``ServingOperator.warmup_requests``);
the first one whose rows all survive the filters wins. When none does, the steps still warm up
(on the filtered rows) and the export says which filter it could not satisfy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving.data import tables, wire
from merlin_torch_serving.data.samples import sample_table
from merlin_torch_serving.export.warmup_files import write_request_sample
from merlin_torch_serving.graph.plan import REQUEST, Plan, Ref, run_calls
from merlin_torch_serving.graph.rehearsal import rehearsing

logger = logging.getLogger("merlin_torch_serving")


@dataclass(frozen=True)
class WarmupInputs:
    """Per step model, its warm-up input arrays in the wire format; ``problem`` says why they are
    not a request that passes every filter (None when they are); ``values``: every column of the
    run they came from (by ref), None when the plan failed on every candidate."""

    arrays: dict[str, dict[str, np.ndarray]]
    problem: str | None = None
    values: dict | None = None


def warmup_inputs(plan: Plan, steps, requests: list[TensorTable] | None = None) -> WarmupInputs:
    """``requests``: the candidates to try (by default those the plan's operators propose)."""
    candidates = requests or [
        request
        for call in plan.calls
        if _reads_request(call)
        for request in call.op.warmup_requests()
    ]
    candidates = candidates or [TensorTable({}, _unsafe=True)]
    failures = []
    filtered = None
    for candidate in candidates:
        request = _complete(candidate, plan)
        try:
            env = _run(plan, request)
        except Exception as error:  # a candidate the graph rejects: try the next one
            failures.append(f"{type(error).__name__}: {error}")
            continue
        dropped = _dropped_by(plan, env)
        if dropped is None:
            return WarmupInputs(_step_arrays(steps, env), values=env)
        filtered = filtered or (env, dropped)
    if filtered is not None:
        env, dropped = filtered
        problem = (
            f"no warm-up request passed {dropped} (tried sessions of several lengths, with values"
            " from the vocabularies and constant numbers); the step models warm up on a filtered"
            " session"
        )
        logger.warning("export: %s", problem)
        return WarmupInputs(_step_arrays(steps, env), problem, env)
    problem = (
        f"the ensemble failed on every warm-up request ({failures[-1]}); steps warm up on schema"
        " samples"
    )
    logger.warning("export: %s", problem)
    return WarmupInputs(
        {step.name: wire.to_wire(sample_table(step.input_schema)) for step in steps}, problem
    )


def write_ensemble_sample(
    ensemble_dir: Path, plan: Plan, warmup: WarmupInputs, count: int, request_dim: bool
) -> None:
    """Save the request the steps' samples came from in the ensemble's folder, for the launcher to
    send through the whole ensemble ``count`` times (nothing when no run of it succeeded, or when
    ``count`` is 0). ``request_dim``: the ensemble batches requests (see ``request_arrays``)."""
    if warmup.values is not None and count:
        write_request_sample(ensemble_dir, request_arrays(plan, warmup.values, request_dim), count)


def request_arrays(plan: Plan, values: dict, request_dim: bool) -> dict[str, np.ndarray]:
    """The request of a warm-up run (``WarmupInputs.values``) as the ensemble's input tensors;
    ``request_dim``: with the leading dimension of 1 a batched ensemble's requests have."""
    table = TensorTable(
        {name: values[Ref(REQUEST, name)] for name in plan.input_schema.column_names},
        _unsafe=True,
    )
    arrays = wire.to_wire(table)
    return {name: array[np.newaxis] for name, array in arrays.items()} if request_dim else arrays


def _reads_request(call) -> bool:
    return any(ref.producer == REQUEST for ref in call.inputs.values())


def _complete(candidate: TensorTable, plan: Plan) -> TensorTable:
    """The candidate with the request columns it lacks sampled from the input schema, in order."""
    rows = tables.num_rows(candidate) or 1
    missing = plan.input_schema.remove_col(
        [name for name in candidate.columns if name in plan.input_schema.column_names]
    )
    filler = sample_table(missing, rows=rows) if len(missing) else None
    columns = {}
    for name in plan.input_schema.column_names:
        source = filler if filler is not None and name not in candidate.columns else candidate
        column = source[name]
        columns[name] = (
            (column.values, column.offsets) if column.offsets is not None else column.values
        )
    return TensorTable(columns, _unsafe=True)


def _run(plan: Plan, request: TensorTable) -> dict:
    env = {Ref(REQUEST, name): column for name, column in request.items()}
    # a warm-up request is no click and nobody's answer: it stores and logs nothing
    with rehearsing():
        run_calls(plan.calls, env, plan.outputs)
    return env


def _dropped_by(plan: Plan, env: dict) -> str | None:
    """What dropped a row of the request, when a workflow marked one as filtered out."""
    for call in plan.calls:
        flag = call.op.filtered_rows_column()
        if flag and np.asarray(env[Ref(call.index, flag)].values).any():
            inputs = TensorTable(
                {name: env[ref] for name, ref in call.inputs.items()}, _unsafe=True
            )
            return call.op.filtered_by(inputs) or f"the filters of {call.op.label}"
    return None


def _step_arrays(steps, env: dict) -> dict[str, dict[str, np.ndarray]]:
    arrays = {}
    for step in steps:
        table = TensorTable({name: env[ref] for name, ref in step.inputs.items()}, _unsafe=True)
        arrays[step.name] = wire.to_wire(table)
    return arrays
