"""One TorchScript module for a libtorch step: its operators' TorchScript forms run one after the
other, as Triton's pytorch backend will call the step.

A libtorch step starts with an operator whose backend is ``"pytorch"``; ``partition`` adds the later
operators that have a TorchScript form (``ServingOperator.torchscript``) and read the step's
outputs that nothing else reads (a top-k selection over a model's scores, the decoding of the ids it
picks, the blanking of filtered sessions). Here each operator's module reads its inputs from the
step's input tensors and from the outputs of the operators before it, and the step returns its
outputs as the config lists them: one Tensor, or a tuple in that order. Every operator's module is
the one its ``transform`` runs in-process, so both answer alike.

The step's ``forward`` is written out as straight-line TorchScript (one call per operator, every
tensor looked up where it is known at export), so the chain costs no more per request than a
hand-written module would.
"""

from __future__ import annotations

import json

import torch

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import ExportError
from merlin_torch_serving.export.partition import TritonStep
from merlin_torch_serving.graph.plan import OpCall, Ref


def operator_chain(stages: list[torch.jit.ScriptModule], source: str) -> torch.jit.ScriptModule:
    """The scripted modules of a step's operators (``stage_0``, ``stage_1``, ...), called in turn by
    the ``forward`` of ``source``.

    Each step gets a class of its own: TorchScript keeps the methods a ScriptModule defines on its
    class, so two chains of one class (two exports in one process) would share the first's forward.
    """

    class OperatorChain(torch.jit.ScriptModule):
        def __init__(self):
            super().__init__()
            for position, stage in enumerate(stages):
                setattr(self, f"stage_{position}", stage)
            self.define(source)

    return OperatorChain()


def libtorch_module(step: TritonStep) -> torch.jit.ScriptModule:
    """The TorchScript that Triton's pytorch backend runs for ``step``."""
    modules = [_scripted(call, step.torchscript[call.index]) for call in step.calls]
    if len(step.calls) == 1 and _returns_in_order(modules[0], step):
        return modules[0]  # the operator's own module, as it is
    return operator_chain(modules, chain_source(step, modules))


def chain_source(step: TritonStep, modules: list[torch.jit.ScriptModule]) -> str:
    """The TorchScript ``forward`` of ``step``: each operator called on a dict of its inputs (step
    inputs, or outputs of the operators before it), then the step's outputs returned in order, a
    ragged list as its values and offsets. (A tuple, not a list: Triton's pytorch backend crashes
    on a returned list.)"""
    known: dict[Ref, dict[str, str]] = {}  # per tensor produced so far: wire suffix -> expression
    lines = []
    for position, (call, module) in enumerate(zip(step.calls, modules, strict=True)):
        arguments = ", ".join(
            f"{_text(name)}: {source}" for name, source in _reads(call, step, known)
        )
        lines.append(f"    out_{position} = self.stage_{position}({{{arguments}}})")
        for name, expressions in _outputs(call, module, f"out_{position}"):
            known[Ref(call.index, name)] = expressions
    returned = []
    for name, ref in step.outputs.items():
        column = step.output_schema[name]
        for spec in wire.column_specs(column):
            returned.append(known[ref][spec.name[len(column.name) :]])
    returns = "Tensor" if len(returned) == 1 else _tuple_type(len(returned))
    header = f"def forward(self, inputs: Dict[str, Tensor]) -> {returns}:"
    return "\n".join([header, *lines, f"    return {', '.join(returned)}", ""])


def _scripted(call: OpCall, module: torch.nn.Module) -> torch.jit.ScriptModule:
    try:
        return torch.jit.script(module)
    except Exception as error:
        raise ExportError(
            f"the TorchScript form of operator {call.op.label} ({type(module).__name__}) does not"
            f" compile: {type(error).__name__}: {error}; note that TorchScript cannot read the"
            " annotations of a module that starts with `from __future__ import annotations`"
        ) from error


def _reads(
    call: OpCall, step: TritonStep, known: dict[Ref, dict[str, str]]
) -> list[tuple[str, str]]:
    """``(name, expression)`` of each wire tensor ``call`` receives: an output of an operator before
    it in the step, or a step input (a ragged column as its values and offsets)."""
    reads: list[tuple[str, str]] = []
    for name, ref in call.inputs.items():
        if ref in known:
            reads.extend((name + suffix, source) for suffix, source in known[ref].items())
            continue
        step_name = next(
            step_name for step_name, step_ref in step.inputs.items() if step_ref == ref
        )
        column = step.input_schema[step_name]
        for sent, received in zip(
            wire.column_specs(column), wire.column_specs(column.with_name(name)), strict=True
        ):
            reads.append((received.name, f"inputs[{_text(sent.name)}]"))
    return reads


def _outputs(
    call: OpCall, module: torch.jit.ScriptModule, result: str
) -> list[tuple[str, dict[str, str]]]:
    """``(output column, {wire suffix: expression})`` for what ``call``'s module returns as
    ``result``: one Tensor, a tuple (or list) of Tensors in output-schema order, or a
    ``Dict[str, Tensor]`` keyed by wire tensor (a ragged list as ``c__values`` and ``c__offsets``,
    any other column under its name)."""
    columns = list(call.output_schema)
    names = [column.name for column in columns]
    returns = module.forward.schema.returns  # type: ignore[attr-defined]  # a ScriptMethod
    kind = str(returns[0].type) if len(returns) == 1 else "nothing"
    if kind == "Dict[str, Tensor]":
        return [
            (
                column.name,
                {
                    spec.name[len(column.name) :]: f"{result}[{_text(spec.name)}]"
                    for spec in wire.column_specs(column)
                },
            )
            for column in columns
        ]
    ragged = [column.name for column in columns if wire.is_ragged(column)]
    if ragged:
        raise ExportError(
            f"the TorchScript form of operator {call.op.label} returns {kind}, but its output"
            f" {ragged[0]!r} is a ragged list: return a Dict[str, Tensor] holding its"
            f" '{ragged[0]}__values' and '{ragged[0]}__offsets'"
        )
    if kind == "Tensor" and len(names) == 1:
        return [(names[0], {"": result})]
    if kind in (_tuple_type(len(names)), "List[Tensor]"):
        return [(name, {"": f"{result}[{position}]"}) for position, name in enumerate(names)]
    raise ExportError(
        f"the TorchScript form of operator {call.op.label} returns {kind}; it must return its"
        f" {len(names)} output(s) {names} as a Tensor (one output), a tuple of {len(names)} Tensors"
        " in that order, or a Dict[str, Tensor] keyed by output column"
    )


def _tuple_type(count: int) -> str:
    return "Tuple[" + ", ".join(["Tensor"] * count) + "]"


def _text(name: str) -> str:
    """A TorchScript string literal."""
    return json.dumps(name, ensure_ascii=False)


def _returns_in_order(module: torch.jit.ScriptModule, step: TritonStep) -> bool:
    """Whether the module of the step's one call returns the step's outputs in their order.

    It must return them as a Tensor, or as a tuple that holds them in that order.
    """
    (call,) = step.calls
    returns = module.forward.schema.returns  # type: ignore[attr-defined]  # a ScriptMethod
    kind = returns[0].type.kind() if len(returns) == 1 else None
    produced = [Ref(call.index, name) for name in call.output_schema.column_names]
    return kind in ("TensorType", "TupleType") and list(step.outputs.values()) == produced
