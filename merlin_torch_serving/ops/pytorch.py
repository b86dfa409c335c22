"""PredictPytorch: run a TorchScript (or eager Transformers4Rec) model on ragged workflow output.

The model is wrapped once, at construction, in a scripted ``WireModel`` that pads ragged inputs;
in-process runs, the python backend and libtorch all call that same module.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import wire
from merlin_torch_serving.exceptions import InputError, SchemaError
from merlin_torch_serving.ops import sequence_length
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.samples import list_length, sample_table, sample_values
from merlin_torch_serving.schemas import catalog_limits, schema_from_json, schema_to_json
from merlin_torch_serving.ops.torch_module import WireModel

MODEL_FILE = "model.pt"
Backend = Literal["pytorch", "python"]


class PredictPytorch(ServingOperator):
    """Score sessions with a PyTorch model.

    Parameters
    ----------
    model
        A TorchScript module, a path to one, or an eager ``torch.nn.Module`` (a Transformers4Rec
        ``Model`` brings its own schemas; any other module needs both schemas and is traced).
        The model takes one ``Dict[str, Tensor]`` of dense inputs.
    input_schema, output_schema
        The model's inputs and outputs. Lists are padded to the model's sequence length (see
        ``max_sequence_length``); a schema that allows longer lists is a ``SchemaError``.
    backend
        ``"pytorch"`` exports a libtorch model (``model.pt``); ``"python"`` runs the same
        TorchScript inside Triton's python backend, fused with neighbouring python steps.
    max_sequence_length
        Length that ragged inputs are padded or truncated to (most recent items kept). A
        Transformers4Rec model brings its own (its sequence features'); for other models it
        defaults to each ragged input's ``value_count.max``.
    pad_value, pad_side
        How short sequences are padded. Transformers4Rec pads with 0 on the right.
    """

    def __init__(
        self,
        model: torch.nn.Module | str | os.PathLike,
        input_schema: Schema | None = None,
        output_schema: Schema | None = None,
        backend: Backend = "pytorch",
        *,
        max_sequence_length: int | None = None,
        pad_value: float = 0,
        pad_side: Literal["right", "left"] = "right",
    ):
        super().__init__()
        if backend not in ("pytorch", "python"):
            raise ValueError(f"backend must be 'pytorch' or 'python', got {backend!r}")
        if pad_side not in ("right", "left"):
            raise ValueError(f"pad_side must be 'right' or 'left', got {pad_side!r}")
        if isinstance(model, (str, os.PathLike)):
            model = torch.jit.load(os.fspath(model), map_location="cpu")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or a path to TorchScript, got {type(model).__name__}")
        model = model.eval()
        input_schema = input_schema if input_schema is not None else getattr(model, "input_schema", None)
        output_schema = output_schema if output_schema is not None else getattr(model, "output_schema", None)
        if input_schema is None or output_schema is None:
            raise SchemaError(
                "PredictPytorch",
                None,
                "the model's input_schema and output_schema",
                "a model that does not carry them",
                "pass PredictPytorch(model, input_schema=..., output_schema=...)",
            )
        self.backend_choice: Backend = backend
        self.pad_value = float(pad_value)
        self.pad_side = pad_side
        self.model_input_schema = sequence_length.with_model_lengths(
            input_schema, sequence_length.model_sequence_lengths(model), max_sequence_length
        )
        example = example_inputs(self.model_input_schema)
        if not isinstance(model, torch.jit.ScriptModule):
            model = _trace(model, example)
        self.module = torch.jit.script(
            WireModel(
                model,
                ragged_inputs=[c.name for c in self.model_input_schema if wire.is_ragged(c)],
                max_lengths=[list_length(c) for c in self.model_input_schema if wire.is_ragged(c)],
                dense_inputs=[c.name for c in self.model_input_schema if not wire.is_ragged(c)],
                pad_value=self.pad_value,
                pad_left=pad_side == "left",
                id_limits=catalog_limits(self.model_input_schema),
            )
        )
        self.model_output_schema = _observed_output_schema(self.module, self.model_input_schema, output_schema)

    # `backend` is what the exporter reads; it is per instance here
    @property
    def backend(self) -> str:  # type: ignore[override]
        return self.backend_choice

    @property
    def label(self) -> str:
        return f"PredictPytorch[{self.backend_choice}]"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return self.model_input_schema

    def root_columns(self) -> list[str]:
        return self.model_input_schema.column_names

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return self.model_output_schema

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        inputs = {name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in wire.to_wire(transformable).items()}
        # TorchScript's optimizing executor re-specialises the graph for every new input shape, and
        # requests of varying sessions and lengths keep bringing new ones (~0.3 s each on 2 cores)
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            try:
                outputs = self.module(inputs)
            except torch.jit.Error as error:
                # the wrapper refuses bad offsets and ids outside the catalog in its last line
                refused = InputError.from_message(str(error).strip().splitlines()[-1])
                if refused is None:
                    raise
                raise refused from None
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return TensorTable(
            {column.name: tensor.numpy() for column, tensor in zip(self.model_output_schema, outputs)},
            _unsafe=True,
        )

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "backend": self.backend_choice,
            "pad_value": self.pad_value,
            "pad_side": self.pad_side,
            "input_schema": schema_to_json(self.model_input_schema),
            "output_schema": schema_to_json(self.model_output_schema),
        }

    def save_artifacts(self, artifact_path=None) -> None:
        torch.jit.save(self.module, os.path.join(artifact_path, MODEL_FILE))

    @classmethod
    def load(cls, config: dict[str, Any], artifact_path: str) -> "PredictPytorch":
        op = cls.__new__(cls)
        ServingOperator.__init__(op)
        op.backend_choice = config["backend"]
        op.pad_value = config["pad_value"]
        op.pad_side = config["pad_side"]
        op.model_input_schema = schema_from_json(config["input_schema"])
        op.model_output_schema = schema_from_json(config["output_schema"])
        op.module = torch.jit.load(os.path.join(artifact_path, MODEL_FILE), map_location="cpu").eval()
        return op


def example_inputs(schema: Schema, rows: int = 2) -> dict[str, torch.Tensor]:
    """Dense model inputs (ragged lists at full length) with legal values, for tracing."""
    inputs = {}
    for i, column in enumerate(schema):
        dims = [rows] + [
            list_length(column) if wire.is_ragged(column) else int(d.max)
            for d in (column.shape.dims or ())[1:]
        ]
        values = sample_values(column, int(np.prod(dims)), seed=i).reshape(dims)
        inputs[column.name] = torch.from_numpy(values)
    return inputs


def _trace(model: torch.nn.Module, example: dict[str, torch.Tensor]) -> torch.jit.ScriptModule:
    with torch.no_grad():
        return torch.jit.trace(model, (example,), strict=True)


def _observed_output_schema(module, input_schema: Schema, declared: Schema) -> Schema:
    """The declared output schema with dtypes and dims as the module really produces them.

    A declared schema can be wrong (Transformers4Rec declares ``[-1, catalog]`` for its top-k
    outputs, which are ``[-1, k]``); configs must describe what the model returns.
    """
    wire_example = {
        name: torch.from_numpy(array)
        for name, array in wire.to_wire(sample_table(input_schema, rows=2)).items()
    }
    with torch.inference_mode():
        outputs = module(wire_example)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    if len(outputs) != len(declared):
        raise SchemaError(
            "PredictPytorch",
            None,
            f"{len(declared)} output(s) as its output_schema declares ({', '.join(declared.column_names)})",
            f"{len(outputs)} tensor(s) from the model",
        )
    columns = []
    for column, tensor in zip(declared, outputs):
        dims = (None,) + tuple(int(d) for d in tensor.shape[1:])
        dtype = np.dtype(str(tensor.dtype).removeprefix("torch."))
        columns.append(
            ColumnSchema(column.name, tags=column.tags, properties=_without_value_count(column.properties), dtype=dtype, dims=dims)
        )
    return Schema(columns)


def _without_value_count(properties: dict) -> dict:
    return {k: v for k, v in properties.items() if k != "value_count"}
