"""Input and output schemas from one sample input, for a model that comes without a Merlin schema
(a bare TorchScript, as plain Triton users have one): names, dtypes and dims are read off the
sample and off what the model returns for it.

A sample is a dict of tensors (or arrays) keyed by input name, a tuple of them in ``forward``'s
argument order, or one tensor for a one-argument ``forward``. The first dimension is the batch;
the others are fixed (a sample cannot say that a list is ragged). Outputs are named by the keys of
a dict result, else Triton's convention ``OUTPUT__<index>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.model_prep.signature import bind_arguments, call_with_dict, read_signature

OUTPUT_NAME = "OUTPUT__{}"


def named_inputs(model: torch.nn.Module, sample, label: str) -> dict[str, torch.Tensor]:
    """The sample as one tensor per input name."""
    if isinstance(sample, Mapping):
        items = dict(sample)
    else:
        values = list(sample) if isinstance(sample, Sequence) else [sample]
        signature = read_signature(model)
        names = [argument.name for argument in signature.arguments]
        takes_dict = len(signature.arguments) >= 1 and signature.arguments[0].kind == "dict"
        if takes_dict or len(values) > len(names):
            raise SchemaError(
                label,
                None,
                f"a sample for {signature.describe()}: "
                + (
                    "a dict of tensors keyed by input name"
                    if takes_dict
                    else f"at most {len(names)} tensor(s)"
                ),
                f"{len(values)} tensor(s) without names",
            )
        items = dict(zip(names, values, strict=False))
    return {name: _as_tensor(name, value, label) for name, value in items.items()}


def input_schema_of(inputs: Mapping[str, torch.Tensor]) -> Schema:
    """One column per sample tensor: its dtype, a variable batch dimension and its other dims."""
    return Schema([_column(name, tensor) for name, tensor in inputs.items()])


def output_schema_of(
    model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], input_schema: Schema, label: str
) -> Schema:
    """The model's outputs for the sample, named by a dict's keys or ``OUTPUT__<index>``."""
    arguments = bind_arguments(read_signature(model), input_schema, label)
    with torch.no_grad():
        outputs = call_with_dict(model, arguments, inputs)
    if isinstance(outputs, Mapping):
        named = dict(outputs)
    else:
        tensors = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        named = {OUTPUT_NAME.format(i): tensor for i, tensor in enumerate(tensors)}
    return Schema([_column(name, tensor) for name, tensor in named.items()])


def _column(name: str, tensor: torch.Tensor) -> ColumnSchema:
    dtype = wire.tensor_numpy_dtype(tensor.dtype)
    return ColumnSchema(name, dtype=dtype, dims=(None, *(int(d) for d in tensor.shape[1:])))


def _as_tensor(name: str, value, label: str) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    if tensor.dim() == 0:
        raise SchemaError(
            label,
            name,
            "a sample with a batch dimension (a 1-D tensor of one value per row, or more dims)",
            "a 0-dimensional tensor",
            "add the batch dimension, e.g. tensor.unsqueeze(0)",
        )
    return tensor
