"""A libtorch step compiled ahead of time: its operators' exportable modules called one after the
other by one eager module (``StepModule``, as ``export.fusion`` chains their TorchScript forms),
exported and compiled into one package, and checked against those modules run eagerly; or, where
that cannot be, why the step stays TorchScript.

``step_form`` decides, once per step, for the export and for in-process runs alike: both then run
the same package (the compile cache gives the export the package in-process runs built), so a
served answer equals the in-process one bit for bit.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np
import torch
from merlin.table import TensorTable

from merlin_torch_serving.aot import tolerance
from merlin_torch_serving.aot.compiling import compiled_package, export_program
from merlin_torch_serving.aot.instruction_sets import NATIVE, instruction_set
from merlin_torch_serving.aot.package import CompiledPackage
from merlin_torch_serving.aot.probing import package_answers
from merlin_torch_serving.data import tables, wire
from merlin_torch_serving.data.samples import sample_table
from merlin_torch_serving.exceptions import PackageError
from merlin_torch_serving.export.partition import TritonStep
from merlin_torch_serving.graph.threads import torch_threads

logger = logging.getLogger("merlin_torch_serving")
#: (rows, items per list) of the inputs a package is checked on against its eager modules
PROBES = ((0, 1), (1, 1), (4, 3), (9, 1_000), (33, 1_000))
#: the input a step is exported on: no dimension of size 0 or 1, which export would specialise
EXAMPLE = (3, 2)
#: how many times over the first operator's warm-up requests make the largest probe
MANY = 12


@dataclass(frozen=True)
class StepForm:
    """How a libtorch step is compiled: ``package``, or None for TorchScript; ``note`` says how
    the package was checked, or why the step stays TorchScript; ``tried``: a package was tried and
    failed (the fallback is a warning)."""

    package: CompiledPackage | None
    note: str
    tried: bool = False
    #: the eager modules the package was compiled from (their checks run before it in-process)
    module: StepModule | None = None


_forms: dict[tuple, tuple[tuple, StepForm]] = {}
_lock = threading.Lock()


def step_form(
    step: TritonStep,
    *,
    instruction_set_name: str = NATIVE,
    threads: int | None = 1,
    request_dim: bool = False,
) -> StepForm:
    """The form of ``step`` (a ``"pytorch"`` step of ``export.partition``) for that instruction set
    and thread count, decided and compiled once per process (and cached on disk after);
    ``request_dim``: taking and returning every tensor in the batched wire form (``[1, ...]``)."""
    operators = tuple(call.op for call in step.calls)
    key = (
        tuple(map(id, operators)),
        tuple(step.inputs.items()),
        tuple(step.outputs.items()),
        instruction_set_name,
        threads,
        request_dim,
    )
    with _lock:
        if key not in _forms:
            # the operators are kept: their ids stay theirs while the entry lives
            _forms[key] = (operators, _decided(step, instruction_set_name, threads, request_dim))
        return _forms[key][1]


def step_label(step: TritonStep) -> str:
    return " + ".join(call.op.label for call in step.calls)


def _decided(
    step: TritonStep, instruction_set_name: str, threads: int | None, request_dim: bool
) -> StepForm:
    label = step_label(step)
    required = [call.op.label for call in step.calls if call.op.requires_package]
    modules = [call.op.exportable(call.input_schema) for call in step.calls]
    missing = [
        call.op.label for call, module in zip(step.calls, modules, strict=True) if not module
    ]
    if missing:
        note = f"{', '.join(missing)} asked for TorchScript or has no form torch.export takes"
        if required:
            raise PackageError(
                f"{label}: {', '.join(required)} asked for an AOTInductor package, but {note}"
            )
        return StepForm(None, f"TorchScript: {note}")
    module = StepModule(step, [module for module in modules if module is not None], request_dim)
    try:
        package = _compiled(step, module, label, instruction_set_name, threads)
    except PackageError as error:
        if required:
            raise
        logger.warning("%s stays TorchScript: %s", label, error)
        return StepForm(None, f"TorchScript, as no package could be made: {error}", tried=True)
    note = (
        f"an AOTInductor package for {package.metadata.get('instruction_set', 'this CPU')} and"
        f" {threads or torch.get_num_threads()} thread(s), within {tolerance.SCORE_TOLERANCE:g}"
        f" of the eager operators on {len(probes(step))} probe inputs"
    )
    logger.info("%s runs as %s", label, note)
    return StepForm(package, note, module=module)


def _compiled(
    step: TritonStep,
    module: StepModule,
    label: str,
    instruction_set_name: str,
    threads: int | None,
) -> CompiledPackage:
    example = tensors(wire.to_wire(sample_table(step.input_schema, *EXAMPLE)), module.request_dim)
    program = export_program(module, example, label, dynamic_dim=int(module.request_dim))
    path = compiled_package(
        program,
        example,
        label=label,
        instruction_set=instruction_set(instruction_set_name),
        threads=threads,
    )
    checked = path.with_suffix(".checked")  # a package of the same key passed these probes
    if not checked.is_file():
        _check(step, module, label, path, threads)
        checked.write_text("probed\n")
    return CompiledPackage(path, label)


def _check(step, module: StepModule, label: str, path, threads: int | None) -> None:
    """Raise ``PackageError`` unless the package, run in a child process on every probe, answers
    within the tolerance of the eager modules (and refuses what they refuse)."""
    names = [spec.name for spec in wire.schema_specs(step.output_schema)]
    inputs = [
        {
            name: tensor.numpy()
            for name, tensor in tensors(wire.to_wire(probe), module.request_dim).items()
        }
        for probe in probes(step)
    ]
    answers = package_answers(path, label, inputs, threads)
    with torch_threads(threads):
        for probe, answer in zip(inputs, answers, strict=True):
            problem = _probe_difference(module, tensors(probe), answer, names)
            if problem is not None:
                rows = next(iter(probe.values()), np.zeros(0)).shape[0]
                raise PackageError(
                    f"{label}: the package answers otherwise than its eager operators on a probe"
                    f" ({rows} values in its first tensor): {problem}"
                )


def probes(step: TritonStep) -> list[TensorTable]:
    """What a package is checked on: sample tables of the step's inputs (none, one, a few and
    several rows; lists of one item, a few, the longest), and, where the step takes what its first
    operator takes, that operator's warm-up requests alone and all of them many times over in one
    request (rows that group into sessions of every length, enough for every vectorised loop)."""
    found = [sample_table(step.input_schema, rows, length) for rows, length in PROBES]
    first = step.calls[0]
    if set(first.inputs.values()) == set(step.inputs.values()):
        own = {
            name: step_name
            for step_name, ref in step.inputs.items()
            for name, r in first.inputs.items()
            if r == ref
        }
        requests = [
            TensorTable({own[name]: column for name, column in request.items()}, _unsafe=True)
            for request in first.op.warmup_requests()
            if set(request.columns) == set(own)
        ]
        if requests:
            found += requests + [tables.concat(requests * MANY)]
    return found


def _probe_difference(module, probe, answer: list[np.ndarray] | str, names) -> str | None:
    """How the package's ``answer`` (its outputs, or the error it raised) differs from what the
    eager modules answer to ``probe``, or None."""
    try:
        with torch.inference_mode():
            reference = list(module(probe))
    except Exception:  # a probe the eager operators refuse: the package must refuse it too
        return None if isinstance(answer, str) else "it answers a probe the eager operators refuse"
    if isinstance(answer, str):
        return f"it fails ({answer[:300]})"
    compiled = [torch.from_numpy(array) for array in answer]
    return tolerance.difference(reference, compiled, names)


def tensors(arrays: dict[str, np.ndarray], request_dim: bool = False) -> dict[str, torch.Tensor]:
    """Wire arrays as tensors (with the batched form's leading 1 when ``request_dim``)."""
    return {
        name: torch.from_numpy(np.ascontiguousarray(array[np.newaxis] if request_dim else array))
        for name, array in arrays.items()
    }


class StepModule(torch.nn.Module):
    """The exportable modules of a step's operators (``stages``), each called on a dict of its
    wire inputs (step inputs, or what an operator before it returned), the step's outputs
    returned as a tuple in the order of its config."""

    def __init__(self, step: TritonStep, stages: list[torch.nn.Module], request_dim: bool = False):
        super().__init__()
        self.stages = torch.nn.ModuleList(stages)
        self.request_dim = request_dim
        position = {call.index: i for i, call in enumerate(step.calls)}
        sent = {ref: name for name, ref in step.inputs.items()}
        #: per stage: (wire name it receives, producing stage or -1 for the step's input, key)
        self.reads: list[list[tuple[str, int, str]]] = []
        for call in step.calls:
            reads = []
            for name, ref in call.inputs.items():
                received = wire.column_specs(call.input_schema[name])
                if ref.producer in position:
                    reads += [
                        (spec.name, position[ref.producer], ref.column + spec.name[len(name) :])
                        for spec in received
                    ]
                else:
                    given = wire.column_specs(step.input_schema[sent[ref]])
                    reads += [(r.name, -1, g.name) for r, g in zip(received, given, strict=True)]
            self.reads.append(reads)
        #: per stage: its output columns and their wire names
        self.columns = [
            [(c.name, [spec.name for spec in wire.column_specs(c)]) for c in call.output_schema]
            for call in step.calls
        ]
        self.returns = [
            (position[ref.producer], ref.column + spec.name[len(name) :])
            for name, ref in step.outputs.items()
            for spec in wire.column_specs(step.output_schema[name])
        ]

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if self.request_dim:  # the batched form: one request, every tensor [1, ...]
            inputs = {name: tensor[0] for name, tensor in inputs.items()}
        produced: list[dict[str, torch.Tensor]] = []
        for stage, reads, columns in zip(self.stages, self.reads, self.columns, strict=True):
            given = {
                name: inputs[key] if producer < 0 else produced[producer][key]
                for name, producer, key in reads
            }
            produced.append(_by_wire_name(stage(given), columns))
        returned = tuple(produced[producer][key] for producer, key in self.returns)
        if self.request_dim:
            return tuple(tensor.unsqueeze(0) for tensor in returned)
        return returned

    def check(self, inputs: dict[str, torch.Tensor]) -> None:
        """Raise what the first stage's own checks raise for ``inputs`` (a ``ValueError`` naming
        the column, with the values), before the package, which cannot quote them."""
        first = self.stages[0]
        check = getattr(first, "check", None)
        if check is not None and not self.request_dim:
            check({name: inputs[key] for name, producer, key in self.reads[0] if producer < 0})


def _by_wire_name(result, columns: list[tuple[str, list[str]]]) -> dict[str, torch.Tensor]:
    """What a stage returned, by wire name: a dict already is; a tuple holds its output columns in
    order, a Tensor its one column."""
    if isinstance(result, dict):
        return result
    if isinstance(result, (tuple, list)):
        return {
            wire_names[0]: tensor for (_, wire_names), tensor in zip(columns, result, strict=True)
        }
    return {columns[0][1][0]: result}
