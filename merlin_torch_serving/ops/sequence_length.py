"""The length a sequence model reads its list inputs at: the model's, never a statistic of the data.

A Transformers4Rec model is built for one length (``TabularSequenceFeatures.from_schema(...,
max_sequence_length=20)``), whatever its input schema says: after ``ValueCount`` that schema holds
the longest list seen in training (say 13), and padding to it would drop clicks the model reads.
Other models take the explicit ``max_sequence_length``, else their schema's ``value_count.max``.
A schema whose lists may hold more items than the model reads disagrees with the model.
"""

from __future__ import annotations

from typing import cast

import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError

OPERATOR = "PredictPytorch"


def model_sequence_lengths(model: torch.nn.Module) -> dict[str, int]:
    """Per list input, the length a Transformers4Rec model's sequence features are built for
    (``{}`` for any other model). ``Model(max_sequence_length=...)``, when set, must agree."""
    if not type(model).__module__.startswith("transformers4rec") or not hasattr(model, "heads"):
        return {}
    lengths: dict[str, int] = {}
    for head in cast(torch.nn.ModuleList, model.heads):
        sizes = (
            getattr(getattr(getattr(head, "body", None), "inputs", None), "input_size", None) or {}
        )
        for name, size in sizes.items():
            if len(size) >= 2 and int(size[1]) > 0:
                lengths[name] = int(size[1])
    declared = getattr(model, "max_sequence_length", None)
    for name, length in lengths.items():
        if declared is not None and int(declared) != length:
            raise SchemaError(
                OPERATOR,
                name,
                f"one sequence length: the model's sequence features are built for {length} items",
                f"Model(max_sequence_length={declared})",
                "build the Model with the same max_sequence_length as its TabularSequenceFeatures",
            )
    return lengths


def with_model_lengths(
    schema: Schema, model_lengths: dict[str, int], max_sequence_length: int | None
) -> Schema:
    """The model's input schema with every list it pads as a ragged list of the model's length.

    ``model_lengths`` (from ``model_sequence_lengths``) win; without them ``max_sequence_length``,
    else each ragged list's own ``value_count.max``. A schema list longer than the length, or an
    explicit length that contradicts the model's own, is a ``SchemaError`` naming both numbers.
    """
    if model_lengths and max_sequence_length is not None:
        name, length = next(iter(model_lengths.items()))
        if int(max_sequence_length) != length:
            raise SchemaError(
                OPERATOR,
                name,
                f"the model's own sequence length, {length} (its Transformers4Rec sequence features"
                " are built for it)",
                f"max_sequence_length={max_sequence_length}",
                "leave max_sequence_length out: the model's own length is used",
            )
    columns = []
    for column in schema:
        if column.name in model_lengths:
            columns.append(
                _padded_to(
                    column,
                    model_lengths[column.name],
                    "the model's sequence features are built for",
                )
            )
        elif wire.is_ragged(column) and max_sequence_length is not None:
            columns.append(_padded_to(column, int(max_sequence_length), "max_sequence_length is"))
        elif wire.is_ragged(column) and column.shape.dims[1].max is None:
            raise SchemaError(
                OPERATOR,
                column.name,
                "a ragged list with a maximum length (value_count.max) to pad to",
                f"{describe_column(column)} without one",
                "pass max_sequence_length=...",
            )
        else:
            columns.append(column)
    return Schema(columns)


def _padded_to(column: ColumnSchema, length: int, source: str) -> ColumnSchema:
    """``column`` as a ragged list of up to ``length`` items.

    Its schema must allow no longer lists.
    """
    longest = _longest_list(column)
    if longest is not None and longest > length:
        raise SchemaError(
            OPERATOR,
            column.name,
            f"lists of at most {length} items ({source} {length})",
            f"a schema that allows lists of {longest} items",
            f"slice the workflow's lists to the model's length (nvt.ops.ListSlice(-{length})) so"
            f" the {length} most recent items reach the model, or give the model a matching schema",
        )
    return column.with_shape((None, (0, length)))


def _longest_list(column: ColumnSchema) -> int | None:
    dims = column.shape.dims
    if dims is None or len(dims) < 2:
        return None  # Transformers4Rec declares a list without value_count as a scalar
    return None if dims[1].max is None else int(dims[1].max)
