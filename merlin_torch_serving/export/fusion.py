"""Compiling a TopK, the DecodeItemIds after it, and the blanking of filtered sessions' rows into
the libtorch model of the PredictPytorch they follow.

The libtorch step then answers with ``[-1, k]`` (raw) ids and scores instead of the whole catalog's
``[-1, catalog]`` scores, and the request crosses one or two python stubs fewer. The selection is
the same scripted ``top_k_items`` that runs in-process, the decoding the same lookup, and the
blanking the same ``blank_rows``, so both give the same answer; the workflow's ``filtered_out``
column comes in as one more input, so answering filtered sessions costs no python hop.
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types

import numpy as np
import torch

from merlin_torch_serving import wire
from merlin_torch_serving.ops.decode import DecodeItemIds
from merlin_torch_serving.ops.filtered import BlankFilteredRows, blank_rows
from merlin_torch_serving.ops.pytorch import PredictPytorch
from merlin_torch_serving.ops.topk import TopK, top_k_items
from merlin_torch_serving.plan import REQUEST, OpCall, Ref


class ScoresToTopK(torch.nn.Module):
    """A single-output scoring module followed by the top-k selection, in one TorchScript.

    ``seen_name`` is the input (wire base name) holding each row's seen items, ``""`` for none;
    a ragged one arrives as ``__values`` / ``__offsets``. ``raw_ids`` (empty for none) maps
    encoded ids to raw ids, -1 for ids that are not items, as ``CategoryVocabulary.decode`` does.
    ``ids_first`` orders the two outputs as the step's config lists them.
    """

    k: int
    seen_name: str
    seen_ragged: bool
    ids_first: bool
    excluded_ids: torch.Tensor
    raw_ids: torch.Tensor

    def __init__(
        self,
        scorer: torch.nn.Module,
        k: int,
        excluded_ids: list[int],
        seen_name: str,
        seen_ragged: bool,
        raw_ids: torch.Tensor,
        ids_first: bool = True,
    ):
        super().__init__()
        self.scorer = scorer
        self.k = k
        self.seen_name = seen_name
        self.seen_ragged = seen_ragged
        self.ids_first = ids_first
        self.register_buffer("excluded_ids", torch.tensor(excluded_ids, dtype=torch.int64))
        self.register_buffer("raw_ids", raw_ids.to(torch.int64))

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.scorer(inputs)
        seen_values: torch.Tensor | None = None
        seen_offsets: torch.Tensor | None = None
        if self.seen_name != "":
            if self.seen_ragged:
                seen_values = inputs[self.seen_name + "__values"].to(torch.int64)
                seen_offsets = inputs[self.seen_name + "__offsets"].to(torch.int64)
            else:
                seen_values = inputs[self.seen_name].to(torch.int64)
        ids, best = top_k_items(scores, self.k, self.excluded_ids, seen_values, seen_offsets)
        size = self.raw_ids.shape[0]
        if size > 0:
            inside = (ids >= 0) & (ids < size)
            ids = torch.where(
                inside, self.raw_ids[torch.clamp(ids, 0, size - 1)], torch.full_like(ids, -1)
            )
        if self.ids_first:
            return ids, best
        return best, ids


class BlankOne(torch.nn.Module):
    """A one-output libtorch module whose output rows are blanked where ``filtered_name`` is
    True."""

    filtered_name: str

    def __init__(self, inner: torch.nn.Module, filtered_name: str):
        super().__init__()
        self.inner = inner
        self.filtered_name = filtered_name

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return blank_rows(self.inner(inputs), inputs[self.filtered_name])


class BlankPair(torch.nn.Module):
    """A two-output libtorch module with both outputs blanked on filtered rows (``swap`` puts them
    in the order the step's config lists them)."""

    filtered_name: str
    swap: bool

    def __init__(self, inner: torch.nn.Module, filtered_name: str, swap: bool = False):
        super().__init__()
        self.inner = inner
        self.filtered_name = filtered_name
        self.swap = swap

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = self.inner(inputs)
        filtered = inputs[self.filtered_name]
        first = blank_rows(first, filtered)
        second = blank_rows(second, filtered)
        if self.swap:
            return second, first
        return first, second


def fusable_top_k(
    call: OpCall, producer: OpCall | None, step_of_call: dict[int, int], consumers: dict[Ref, int]
) -> bool:
    """Whether ``call`` (a TopK) can run inside ``producer``'s libtorch model.

    It can when ``producer`` is the libtorch PredictPytorch whose only output ``call`` ranks,
    nothing else reads that output (the scores then never leave the model), and the seen items
    come with the request or from a step that runs before the model.
    """
    if (
        producer is None
        or not isinstance(call.op, TopK)
        or not isinstance(producer.op, PredictPytorch)
    ):
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
    return (
        seen_ref.producer in step_of_call
        and step_of_call[seen_ref.producer] < step_of_call[producer.index]
    )


def fusable_decode(
    call: OpCall, producer: OpCall | None, producer_backend: str | None, consumers: dict[Ref, int]
) -> bool:
    """Whether ``call`` (a DecodeItemIds) can run inside the libtorch model that ``producer``, a
    TopK, was fused into (``producer_backend`` is its step's backend): it decodes TopK's ids to
    integers, reads exactly TopK's two outputs, and nothing else reads them."""
    if (
        producer is None
        or not isinstance(call.op, DecodeItemIds)
        or not isinstance(producer.op, TopK)
    ):
        return False
    if producer_backend != "pytorch":
        return False
    if call.op.vocabulary.raw_values.dtype.kind not in "iu" or call.op.columns != [
        producer.op.ids_column
    ]:
        return False
    produced = {Ref(producer.index, name) for name in producer.output_schema.column_names}
    return set(call.inputs.values()) == produced and all(
        consumers.get(ref, 0) == 1 for ref in produced
    )


def fusable_blank(
    call: OpCall,
    producer: OpCall | None,
    producer_backend: str | None,
    consumers: dict[Ref, int],
    step_of_call: dict[int, int],
) -> bool:
    """Whether ``call`` (a BlankFilteredRows) can run inside the libtorch step that ``producer``,
    the last operator compiled into it, belongs to: it blanks exactly that operator's one or two
    numeric outputs, nothing else reads them, and the mark comes from an earlier step."""
    if (
        producer is None
        or producer_backend != "pytorch"
        or not isinstance(call.op, BlankFilteredRows)
    ):
        return False
    flag_ref = call.inputs[call.op.filtered_column]
    blanked = [ref for name, ref in call.inputs.items() if name != call.op.filtered_column]
    produced = [Ref(producer.index, name) for name in producer.output_schema.column_names]
    if (
        set(blanked) != set(produced)
        or len(produced) > 2
        or any(consumers.get(ref, 0) != 1 for ref in produced)
    ):
        return False
    if any(
        producer.output_schema[ref.column].dtype.element_type.value == "string" for ref in produced
    ):
        return False
    step = step_of_call[producer.index]
    return flag_ref.producer == REQUEST or step_of_call.get(flag_ref.producer, step) < step


def libtorch_module(
    calls: list[OpCall], step_inputs: dict[str, Ref], step_outputs: dict[str, Ref], input_schema
) -> torch.jit.ScriptModule:
    """The TorchScript of a libtorch step: the model alone, or with its fused TopK (and decoding),
    and the blanking of filtered rows around either."""
    if isinstance(calls[-1].op, BlankFilteredRows):
        blank = calls[-1]
        inner_calls = calls[:-1]
        inner = _model_module(inner_calls, step_inputs, step_outputs, input_schema)
        flag_ref = blank.inputs[blank.op.filtered_column]
        filtered_name = next(name for name, ref in step_inputs.items() if ref == flag_ref)
        if len(step_outputs) == 1:
            return torch.jit.script(BlankOne(inner, filtered_name))
        # the inner module returns its last operator's outputs in that operator's order
        inner_order = inner_calls[-1].output_schema.column_names if len(inner_calls) == 1 else None
        swap = inner_order is not None and inner_order != [
            ref.column for ref in step_outputs.values()
        ]
        return torch.jit.script(BlankPair(inner, filtered_name, swap))
    return _model_module(calls, step_inputs, step_outputs, input_schema)


def _model_module(
    calls: list[OpCall], step_inputs: dict[str, Ref], step_outputs: dict[str, Ref], input_schema
) -> torch.jit.ScriptModule:
    """The model alone, or with its fused TopK (and decoding) in the order of ``step_outputs``."""
    predict = calls[0].op
    if len(calls) == 1:
        return predict.module
    top_k: TopK = calls[1].op
    seen_name, seen_ragged = "", False
    if top_k.seen_column is not None:
        seen_ref = calls[1].inputs[top_k.seen_column]
        seen_name = next(name for name, ref in step_inputs.items() if ref == seen_ref)
        seen_ragged = wire.is_ragged(input_schema[seen_name])
    raw_ids = torch.zeros(0, dtype=torch.int64)
    if len(calls) == 3:
        vocabulary = calls[2].op.vocabulary
        raw_ids = torch.from_numpy(
            np.where(vocabulary.is_item, vocabulary.raw_values, -1).astype(np.int64)
        )
    ids_first = [ref.column for ref in step_outputs.values()] == [
        top_k.ids_column,
        top_k.scores_column,
    ]
    module = ScoresToTopK(
        predict.module, top_k.k, top_k.exclude_ids, seen_name, seen_ragged, raw_ids, ids_first
    )
    return torch.jit.script(module)
