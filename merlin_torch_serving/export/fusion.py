"""Compiling a TopK into the libtorch model of the PredictPytorch it follows.

The libtorch step then answers with ``[-1, k]`` ids and scores instead of the whole catalog's
``[-1, catalog]`` scores, and the request crosses one python stub fewer. The selection is the same
scripted ``top_k_items`` that runs in-process, so both give the same answer.
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
from typing import Dict, List, Optional, Tuple

import torch

from merlin_torch_serving import wire
from merlin_torch_serving.ops.pytorch import PredictPytorch
from merlin_torch_serving.ops.topk import TopK, top_k_items
from merlin_torch_serving.plan import REQUEST, OpCall, Ref


class ScoresToTopK(torch.nn.Module):
    """A single-output scoring module followed by the top-k selection, in one TorchScript.

    ``seen_name`` is the input (wire base name) holding each row's seen items, ``""`` for none;
    a ragged one arrives as ``__values`` / ``__offsets``.
    """

    k: int
    seen_name: str
    seen_ragged: bool

    def __init__(self, scorer: torch.nn.Module, k: int, excluded_ids: List[int], seen_name: str, seen_ragged: bool):
        super().__init__()
        self.scorer = scorer
        self.k = k
        self.seen_name = seen_name
        self.seen_ragged = seen_ragged
        self.register_buffer("excluded_ids", torch.tensor(excluded_ids, dtype=torch.int64))

    def forward(self, inputs: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        scores = self.scorer(inputs)
        seen_values: Optional[torch.Tensor] = None
        seen_offsets: Optional[torch.Tensor] = None
        if self.seen_name != "":
            if self.seen_ragged:
                seen_values = inputs[self.seen_name + "__values"].to(torch.int64)
                seen_offsets = inputs[self.seen_name + "__offsets"].to(torch.int64)
            else:
                seen_values = inputs[self.seen_name].to(torch.int64)
        return top_k_items(scores, self.k, self.excluded_ids, seen_values, seen_offsets)


def fusable_top_k(call: OpCall, producer: OpCall | None, step_of_call: dict[int, int], consumers: dict[Ref, int]) -> bool:
    """Whether ``call`` (a TopK) can run inside ``producer``'s libtorch model.

    It can when ``producer`` is the libtorch PredictPytorch whose only output ``call`` ranks,
    nothing else reads that output (the scores then never leave the model), and the seen items
    come with the request or from a step that runs before the model.
    """
    if producer is None or not isinstance(call.op, TopK) or not isinstance(producer.op, PredictPytorch):
        return False
    if producer.op.backend != "pytorch" or len(producer.output_schema) != 1:
        return False
    scores_ref = Ref(producer.index, producer.output_schema.column_names[0])
    # TopK's inputs list its scores first
    if next(iter(call.inputs.values())) != scores_ref or consumers.get(scores_ref, 0) != 1:
        return False
    seen_ref = call.inputs.get(call.op.seen_column) if call.op.seen_column else None
    if seen_ref is None or seen_ref.producer == REQUEST:
        return True
    return seen_ref.producer in step_of_call and step_of_call[seen_ref.producer] < step_of_call[producer.index]


def libtorch_module(calls: list[OpCall], step_inputs: dict[str, Ref], input_schema) -> torch.jit.ScriptModule:
    """The TorchScript of a libtorch step: the model alone, or the model and its fused TopK."""
    predict = calls[0].op
    if len(calls) == 1:
        return predict.module
    top_k: TopK = calls[1].op
    seen_name, seen_ragged = "", False
    if top_k.seen_column is not None:
        seen_ref = calls[1].inputs[top_k.seen_column]
        seen_name = next(name for name, ref in step_inputs.items() if ref == seen_ref)
        seen_ragged = wire.is_ragged(input_schema[seen_name])
    return torch.jit.script(ScoresToTopK(predict.module, top_k.k, top_k.exclude_ids, seen_name, seen_ragged))
