"""A Transformers4Rec next-item model seen as what it computes: a session encoder, and scores that
are the session's vector times an item table.

``NextItemPredictionTask`` (23.x) scores the catalog as ``hidden @ item_table.T``, divided by its
``softmax_temperature`` when that is set, with no softmax at inference (its loss applies it in
training). The table is the item-id embedding when weights are tied, the task's own output layer
otherwise. So an inner-product search over that table, queried with the session's hidden vector,
ranks items as the model does; ``session_encoder`` returns the model up to that vector, without
changing the user's model or copying its weights.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

import torch

from merlin_torch_serving.exceptions import ModelPreparationError

#: the output name of a Transformers4Rec model split at its session vector
SESSION_EMBEDDING = "session_embedding"


@dataclass(frozen=True)
class NextItemScoring:
    """How a next-item model turns a session vector into the catalog's scores."""

    #: ``[catalog, d]``: row ``i`` scores item id ``i``
    item_vectors: torch.Tensor
    #: scores are inner products divided by it; ``None`` when the model does not divide
    temperature: float | None


class _SessionVector(torch.nn.Module):
    """Stands in for the task's output layer: hands the session's hidden vector on unscored (the
    task unpacks ``(scores, targets)`` from its output layer)."""

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None, **kwargs):
        return inputs, targets


def next_item_scoring(model: torch.nn.Module) -> NextItemScoring:
    """The item table and temperature the model scores its catalog with (shared, not copied)."""
    output_layer = _output_layer(next_item_task(model))
    if output_layer.weight_tying:
        vectors = output_layer.item_embedding_table.weight
    else:
        vectors = output_layer.output_layer
    temperature = output_layer.softmax_temperature
    if temperature and float(temperature) < 0:
        raise ModelPreparationError(
            type(model).__name__,
            f"divides its scores by a negative softmax_temperature ({temperature}), which reverses"
            " the ranking",
            "give NextItemPredictionTask a positive softmax_temperature",
        )
    return NextItemScoring(vectors.detach(), float(temperature) if temperature else None)


def session_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """The model returning each session's vector ``[rows, d]`` instead of the catalog's scores.

    A structural copy of the model whose parameters and buffers are the model's own (no weight is
    copied, the user's model is not changed), with the task's output layer replaced by a step that
    passes the vector on and the model's ``top_k`` turned off.
    """
    task = next_item_task(model)
    _output_layer(task)  # fails early on a model this split does not understand
    shared = {id(tensor): tensor for tensor in itertools.chain(model.parameters(), model.buffers())}
    encoder = copy.deepcopy(model, memo=shared)
    next_item_task(encoder).pre = _SessionVector()
    encoder.top_k = None  # type: ignore[assignment]  # a plain attribute of Transformers4Rec's Model
    return encoder.eval()


def next_item_task(model: torch.nn.Module):
    """The one ``NextItemPredictionTask`` of a Transformers4Rec model with one head."""
    name = type(model).__name__
    if not type(model).__module__.startswith("transformers4rec") or not hasattr(model, "heads"):
        raise ModelPreparationError(
            name,
            "is not a Transformers4Rec Model, so it cannot be split into a session encoder and an"
            " item table",
            "give a model whose output is the query vector, and the item vectors to"
            " RetrieveTopK(item_vectors=...)",
        )
    heads: Any = model.heads  # Transformers4Rec's heads, untyped
    tasks = [task for head in heads for task in head.prediction_task_dict.values()]
    next_item = [task for task in tasks if type(task).__name__ == "NextItemPredictionTask"]
    if len(tasks) != 1 or len(next_item) != 1:
        kinds = ", ".join(type(task).__name__ for task in tasks) or "none"
        raise ModelPreparationError(
            name,
            f"has {len(tasks)} prediction task(s) ({kinds}); only a model with one"
            " NextItemPredictionTask scores the catalog as its session vector times an item table",
        )
    return next_item[0]


def _output_layer(task):
    """The task's built output layer (``_NextItemPredictionTask``), which holds the table."""
    layer = getattr(getattr(task, "pre", None), "module", None)
    if layer is None or not hasattr(layer, "weight_tying"):
        raise ModelPreparationError(
            type(task).__name__,
            "has no built output layer (call the model once, or build it with its Head, before"
            " serving)",
        )
    return layer
