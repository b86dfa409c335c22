"""Where a model's input and output schemas come from, first found wins: given by the caller, a
schema file saved with the model, the schemas the model carries (a Transformers4Rec ``Model``),
or one sample input."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from merlin.schema import Schema

from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.model_prep.sample import input_schema_of, output_schema_of


def model_schemas(
    model: torch.nn.Module,
    input_schema: Schema | None,
    output_schema: Schema | None,
    *,
    saved_input_schema: Schema | None,
    sample: Mapping[str, torch.Tensor] | None,
    label: str,
) -> tuple[Schema, Schema]:
    """(input schema, output schema), or a ``SchemaError`` that says how to give them."""
    input_schema = _first_of(
        input_schema,
        saved_input_schema,
        getattr(model, "input_schema", None),
        None if sample is None else input_schema_of(sample),
    )
    if input_schema is not None and output_schema is None:
        output_schema = _first_of(
            getattr(model, "output_schema", None),
            None if sample is None else output_schema_of(model, sample, input_schema, label),
        )
    if input_schema is None or output_schema is None:
        raise SchemaError(
            label,
            None,
            "the model's input_schema and output_schema",
            "a model that does not carry them",
            f"pass {label}(model, input_schema=..., output_schema=...), or one sample input:"
            f" {label}(model, sample=...)",
        )
    return input_schema, output_schema


def _first_of(*candidates):
    return next((candidate for candidate in candidates if candidate is not None), None)
