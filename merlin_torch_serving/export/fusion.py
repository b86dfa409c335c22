"""One TorchScript module for a libtorch step: its operators' TorchScript forms run one after the
other, as Triton's pytorch backend will call the step.

A libtorch step starts with an operator whose backend is ``"pytorch"``; ``partition`` adds the later
operators that have a TorchScript form (``ServingOperator.torchscript``) and read the step's
outputs that nothing else reads (a top-k selection over a model's scores, the decoding of the ids it
picks, the blanking of filtered sessions). Here each operator's module reads its inputs from the
step's input tensors and from the outputs of the operators before it, and the step returns its
outputs as the config lists them: one Tensor, or a tuple in that order. Every operator's module is
the one its ``transform`` runs in-process, so both answer alike.
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
from typing import Dict, List, Tuple

import torch

from merlin_torch_serving import wire
from merlin_torch_serving.exceptions import ExportError
from merlin_torch_serving.export.partition import TritonStep
from merlin_torch_serving.plan import OpCall, Ref


class NamedOutputs(torch.nn.Module):
    """An operator's module with its outputs keyed by output column: it may return one Tensor, a
    tuple (or list) of them in output-schema order, or a ``Dict[str, Tensor]`` already."""

    names: List[str]

    def __init__(self, module: torch.nn.Module, names: List[str]):
        super().__init__()
        self.module = module
        self.names = names

    def forward(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        produced = self.module(inputs)
        named: Dict[str, torch.Tensor] = {}
        # each test is decided when the module is scripted, by the type the operator's module returns
        if torch.jit.isinstance(produced, Dict[str, torch.Tensor]):
            named = produced
        elif isinstance(produced, torch.Tensor):
            named[self.names[0]] = produced
        else:
            position = 0
            for tensor in produced:
                named[self.names[position]] = tensor
                position += 1
        return named


class OperatorChain(torch.nn.Module):
    """Runs ``stages`` (``NamedOutputs``) in order and returns the tensors of ``returns``.

    ``reads[i]`` lists what stage ``i`` receives as ``(from_step_inputs, key, name)``: the step
    input tensor ``key``, or the output an earlier stage wrote under ``key``, passed as ``name``.
    ``writes[i]`` lists ``(output column, key)`` for the outputs of stage ``i``.
    """

    reads: List[List[Tuple[bool, str, str]]]
    writes: List[List[Tuple[str, str]]]
    returns: List[str]

    def __init__(
        self,
        stages: List[torch.nn.Module],
        reads: List[List[Tuple[bool, str, str]]],
        writes: List[List[Tuple[str, str]]],
        returns: List[str],
    ):
        super().__init__()
        self.stages = torch.nn.ModuleList(stages)
        self.reads = reads
        self.writes = writes
        self.returns = returns

    def forward(self, inputs: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        produced: Dict[str, torch.Tensor] = {}
        for index, stage in enumerate(self.stages):
            arguments: Dict[str, torch.Tensor] = {}
            for from_step_inputs, key, name in self.reads[index]:
                arguments[name] = inputs[key] if from_step_inputs else produced[key]
            outputs = stage(arguments)
            for name, key in self.writes[index]:
                produced[key] = outputs[name]
        return [produced[key] for key in self.returns]


class TupleOutputs(torch.jit.ScriptModule):
    """The chain's list of outputs as libtorch takes them: one Tensor, or a tuple of ``count``.

    TorchScript types a tuple by its length, so ``forward`` is defined for the count at hand (Triton's
    pytorch backend crashes on a returned list)."""

    def __init__(self, chain: torch.jit.ScriptModule, count: int):
        super().__init__()
        self.chain = chain
        returns = "Tensor" if count == 1 else "Tuple[" + ", ".join(["Tensor"] * count) + "]"
        values = ", ".join(f"outputs[{position}]" for position in range(count))
        self.define(
            f"def forward(self, inputs: Dict[str, Tensor]) -> {returns}:\n"
            f"    outputs = self.chain(inputs)\n"
            f"    return {values}\n"
        )


def libtorch_module(step: TritonStep) -> torch.jit.ScriptModule:
    """The TorchScript that Triton's pytorch backend runs for ``step``."""
    modules = [_scripted(call, step.torchscript[call.index]) for call in step.calls]
    if len(step.calls) == 1 and _returns_in_order(modules[0], step):
        return modules[0]  # the operator's own module, as it is
    reads, writes = [], []
    for call in step.calls:
        reads.append(_reads(call, step))
        writes.append([(name, _key(Ref(call.index, name))) for name in call.output_schema.column_names])
    stages = [NamedOutputs(module, call.output_schema.column_names) for module, call in zip(modules, step.calls)]
    chain = OperatorChain(stages, reads, writes, [_key(ref) for ref in step.outputs.values()])
    return TupleOutputs(torch.jit.script(chain), len(step.outputs))


def _scripted(call: OpCall, module: torch.nn.Module) -> torch.jit.ScriptModule:
    try:
        return torch.jit.script(module)
    except Exception as error:
        raise ExportError(
            f"the TorchScript form of operator {call.op.label} ({type(module).__name__}) does not compile: "
            f"{type(error).__name__}: {error}; note that TorchScript cannot read the annotations of a module "
            "that starts with `from __future__ import annotations`"
        ) from error


def _reads(call: OpCall, step: TritonStep) -> List[Tuple[bool, str, str]]:
    """Where each input tensor of ``call`` comes from inside ``step``."""
    own = step.call_indices
    reads = []
    for name, ref in call.inputs.items():
        if ref.producer in own:
            reads.append((False, _key(ref), name))
            continue
        step_name = next(step_name for step_name, step_ref in step.inputs.items() if step_ref == ref)
        column = step.input_schema[step_name]
        for sent, received in zip(wire.column_specs(column), wire.column_specs(column.with_name(name))):
            reads.append((True, sent.name, received.name))
    return reads


def _key(ref: Ref) -> str:
    return f"{ref.producer}:{ref.column}"


def _returns_in_order(module: torch.jit.ScriptModule, step: TritonStep) -> bool:
    """Whether the module of the step's one call returns a Tensor or a tuple that holds the step's
    outputs in their order."""
    (call,) = step.calls
    returns = module.forward.schema.returns
    kind = returns[0].type.kind() if len(returns) == 1 else None
    produced = [Ref(call.index, name) for name in call.output_schema.column_names]
    return kind in ("TensorType", "TupleType") and list(step.outputs.values()) == produced
