"""PredictPytorch: run a PyTorch model (TorchScript or eager, any ``forward`` signature) on ragged
workflow output.

The model is prepared once, at construction (``model_prep``: scripted, traced, or kept eager, so
that it answers like the eager model), and wrapped in a ``WireModel`` that pads ragged inputs.
In-process runs, the python backend and libtorch all call that same module.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Literal

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.aot.choice import compiled_choice
from merlin_torch_serving.data import wire
from merlin_torch_serving.data.samples import padded_length, sample_table
from merlin_torch_serving.data.schemas import catalog_limits, schema_from_json, schema_to_json
from merlin_torch_serving.exceptions import (
    InputError,
    ModelPreparationError,
    PackageError,
    SchemaError,
)
from merlin_torch_serving.model_prep.eager import (
    EAGER_MODEL_FILE,
    load_eager_model,
    save_eager_model,
)
from merlin_torch_serving.model_prep.next_item import (
    SESSION_EMBEDDING,
    next_item_scoring,
    session_encoder,
)
from merlin_torch_serving.model_prep.prepare import Execution, prepare_model
from merlin_torch_serving.model_prep.sample import named_inputs
from merlin_torch_serving.model_prep.schemas import model_schemas
from merlin_torch_serving.model_prep.signature import DictCall, bind_arguments, read_signature
from merlin_torch_serving.model_prep.sources import load_model
from merlin_torch_serving.ops import sequence_length
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.torch_module import OneOutputWireModel, WireModel
from merlin_torch_serving.tensors.huge_pages import collapse_onto_huge_pages

MODEL_FILE = "model.pt"
Backend = Literal["pytorch", "python"]


class PredictPytorch(ServingOperator):
    """Score rows (sessions, users, ...) with a PyTorch model.

    Parameters
    ----------
    model
        A TorchScript module, an eager ``torch.nn.Module``, or a path to a TorchScript file, a
        ``torch.save`` file of a module, or the folder Transformers4Rec's ``Model.save()`` wrote.
        ``forward`` takes one ``Dict[str, Tensor]`` of dense inputs, or one tensor per argument
        (bound to input columns by name, or by Triton's ``<name>__<index>`` convention), and
        returns a tensor, a tuple of tensors, or a dict of them (named by the output schema).
    input_schema, output_schema
        The model's inputs and outputs; taken from the model when it carries them (a
        Transformers4Rec ``Model``), else from ``sample``. Lists are padded to the model's sequence
        length (see ``max_sequence_length``); a schema that allows longer lists is a
        ``SchemaError``. Output dtypes and dims are probed from the model; the schema names the
        outputs.
    backend
        ``"pytorch"`` exports a libtorch model: an AOTInductor package (``model.pt2``) or
        TorchScript (``model.pt``), see ``compiled``; ``"python"`` runs the model inside Triton's
        python backend, fused with neighbouring python steps. ``None`` picks ``"pytorch"`` when
        the model is TorchScript or compiles to TorchScript that answers like it, else
        ``"python"``.
    compiled
        What the libtorch step holding the model (with the top-k, decoding and blanking compiled
        into it) is: ``"auto"`` compiles it ahead of time with ``torch.export`` and AOTInductor
        into a package where torch.export takes the model and the package answers within 1e-5 of
        the eager modules, and keeps TorchScript where not (the log and the export's manifest say
        why); ``"package"`` fails instead of keeping TorchScript; ``"torchscript"`` keeps
        TorchScript. In-process runs use the step's package too (compiled once, then cached).
        ``None`` takes ``$MTS_COMPILED`` ("auto" when unset). See the guide "Compiled ahead of
        time".
    sample
        One sample input (a dict of tensors keyed by input name, a tuple of tensors in ``forward``'s
        order, or one tensor), from which missing schemas are derived; also the first input a
        compiled model is checked on.
    execution
        ``"auto"`` scripts an eager model, else traces it, keeping either only if it equals the
        eager model on varied probe inputs, else runs it eagerly on the python backend (one log
        line says which and why). ``"torchscript"`` fails instead of running eagerly; ``"eager"``
        skips compiling.
    max_sequence_length
        Length that ragged inputs are padded or truncated to (most recent items kept). A
        Transformers4Rec model brings its own (its sequence features'); for other models it
        defaults to each ragged input's ``value_count.max``.
    pad_value, pad_side
        How short sequences are padded. Transformers4Rec pads with 0 on the right.
    output
        ``"session_embedding"`` splits a Transformers4Rec next-item model at the session's vector:
        the step returns that vector (float ``[-1, d]``, column ``session_embedding``) instead of
        the catalog's scores, for ``RetrieveTopK(k, item_vectors=model)`` to rank the items with.
        The user's model is not changed; nothing else is needed. ``None`` (the default) keeps the
        model's own outputs.
    """

    def __init__(
        self,
        model: torch.nn.Module | str | os.PathLike,
        input_schema: Schema | None = None,
        output_schema: Schema | None = None,
        backend: Backend | None = None,
        *,
        sample: Any = None,
        execution: Execution = "auto",
        max_sequence_length: int | None = None,
        pad_value: float = 0,
        pad_side: Literal["right", "left"] = "right",
        output: Literal["session_embedding"] | None = None,
        compiled: Literal["auto", "package", "torchscript"] | None = None,
    ):
        super().__init__()
        _check_choice("backend", backend, (None, "pytorch", "python"))
        chosen = compiled_choice(compiled)
        if chosen == "package" and backend == "python":
            raise ValueError(
                "compiled='package' makes a libtorch step of the model; pass backend='pytorch' (or"
                " leave backend out)"
            )
        backend = "pytorch" if chosen == "package" else backend
        _check_choice("execution", execution, ("auto", "torchscript", "eager"))
        _check_choice("pad_side", pad_side, ("right", "left"))
        _check_choice("output", output, (None, SESSION_EMBEDDING))
        if backend == "pytorch" and execution == "eager":
            raise ValueError(
                "backend='pytorch' (libtorch) runs TorchScript only; pass backend='python' to run"
                " eagerly"
            )
        saved_input_schema = None
        if isinstance(model, (str, os.PathLike)):
            model, saved_input_schema = load_model(model)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module or a path to one, got {type(model).__name__}"
            )
        if output == SESSION_EMBEDDING:
            model, output_schema = (
                session_encoder(model),
                output_schema or _session_embedding_schema(model),
            )
        model = model.eval()
        sample_inputs = None if sample is None else named_inputs(model, sample, "PredictPytorch")
        input_schema, output_schema = model_schemas(
            model,
            input_schema,
            output_schema,
            saved_input_schema=saved_input_schema,
            sample=sample_inputs,
            label="PredictPytorch",
        )
        self.pad_value = float(pad_value)
        self.pad_side = pad_side
        self.model_input_schema = sequence_length.with_model_lengths(
            input_schema, sequence_length.model_sequence_lengths(model), max_sequence_length
        )
        prepared = prepare_model(
            model,
            self.model_input_schema,
            output_schema.column_names,
            label="PredictPytorch",
            execution=execution,
            require_torchscript=backend == "pytorch" and chosen == "torchscript",
            pad_value=self.pad_value,
            pad_left=pad_side == "left",
            sample=sample_inputs,
        )
        self.execution = prepared.execution
        self.backend_choice: Backend = backend or (
            "pytorch" if prepared.execution == "torchscript" else "python"
        )
        # what save_artifacts writes: the compiled module, or the user's own eager module
        self.model = prepared.module if prepared.execution == "torchscript" else model
        wrapping = {
            "ragged_inputs": [c.name for c in self.model_input_schema if wire.is_ragged(c)],
            "max_lengths": [padded_length(c) for c in self.model_input_schema if wire.is_ragged(c)],
            "dense_inputs": [c.name for c in self.model_input_schema if not wire.is_ragged(c)],
            "pad_value": self.pad_value,
            "pad_left": pad_side == "left",
            "id_limits": catalog_limits(self.model_input_schema),
        }
        self.module = _wire_module(prepared.module, prepared.execution, wrapping)
        self.model_output_schema = _observed_output_schema(
            self.module, self.model_input_schema, output_schema
        )
        self.compiled = chosen
        # a libtorch step that cannot fall back on TorchScript must be a package
        self.requires_package = chosen == "package" or (
            self.backend_choice == "pytorch" and prepared.execution == "eager"
        )
        self._exportable = (
            None
            if isinstance(model, torch.jit.ScriptModule) or chosen == "torchscript"
            else _exportable_module(model, self.model_input_schema, output_schema, wrapping)
        )
        if backend == "pytorch" and prepared.execution == "eager":
            # libtorch was asked for and TorchScript cannot serve: a package must, so find out now
            _check_exports(
                self._exportable, self.model_input_schema, type(model).__name__, prepared.reason
            )
        self._weights_on_huge_pages = False

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
        if not self._weights_on_huge_pages:  # once: a large item table then reads faster
            weights = itertools.chain(self.module.parameters(), self.module.buffers())
            collapse_onto_huge_pages(weights)
            self._weights_on_huge_pages = True
        inputs = {
            name: torch.from_numpy(np.ascontiguousarray(array))
            for name, array in wire.to_wire(transformable).items()
        }
        # TorchScript's optimizing executor re-specialises the graph for every new input shape, and
        # requests of varying sessions and lengths keep bringing new ones (~0.3 s each on 2 cores)
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            try:
                outputs = self.module(inputs)
            except (torch.jit.Error, ValueError) as error:
                # the wrapper (scripted, or eager) refuses bad offsets, row counts and ids outside
                # the catalog; its message is the error's last line
                refused = InputError.from_message(str(error).strip().splitlines()[-1])
                if refused is None:
                    raise
                raise refused from None
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return TensorTable(
            {
                column.name: tensor.numpy()
                for column, tensor in zip(self.model_output_schema, outputs, strict=True)
            },
            _unsafe=True,
        )

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "backend": self.backend_choice,
            "execution": self.execution,
            "compiled": self.compiled,
            "pad_value": self.pad_value,
            "pad_side": self.pad_side,
            "input_schema": schema_to_json(self.model_input_schema),
            "output_schema": schema_to_json(self.model_output_schema),
        }

    def save_artifacts(self, artifact_path=None) -> None:
        if self.execution == "eager":
            save_eager_model(self.model, artifact_path)
        else:
            torch.jit.save(self.model, os.path.join(artifact_path, MODEL_FILE))

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        if config["execution"] == "eager":
            model = load_eager_model(os.path.join(artifact_path, EAGER_MODEL_FILE))
        else:
            model = torch.jit.load(os.path.join(artifact_path, MODEL_FILE), map_location="cpu")
        return {
            **config,
            "model": model,
            "input_schema": schema_from_json(config["input_schema"]),
            "output_schema": schema_from_json(config["output_schema"]),
        }

    def torchscript(self, input_schema: Schema) -> torch.nn.Module | None:
        """The wrapped model, when it runs on libtorch (a python-backend model stays there)."""
        return self.module if self.backend_choice == "pytorch" else None

    def exportable(self, input_schema: Schema) -> torch.nn.Module | None:
        """The eager model in its wire wrapper, for an AOTInductor package (libtorch steps whose
        model is not TorchScript already, unless ``compiled="torchscript"``)."""
        return self._exportable if self.backend_choice == "pytorch" else None


def _check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")


def _session_embedding_schema(model: torch.nn.Module) -> Schema:
    dimension = int(next_item_scoring(model).item_vectors.shape[1])
    return Schema([ColumnSchema(SESSION_EMBEDDING, dtype=np.float32, dims=(None, dimension))])


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
            f"{len(declared)} output(s) as its output_schema declares"
            f" ({', '.join(declared.column_names)})",
            f"{len(outputs)} tensor(s) from the model",
        )
    columns = []
    for column, tensor in zip(declared, outputs, strict=True):
        dims = (None,) + tuple(int(d) for d in tensor.shape[1:])
        dtype = wire.tensor_numpy_dtype(tensor.dtype)
        columns.append(
            ColumnSchema(
                column.name,
                tags=column.tags,
                properties=_without_value_count(column.properties),
                dtype=dtype,
                dims=dims,
            )
        )
    return Schema(columns)


def _without_value_count(properties: dict) -> dict:
    return {k: v for k, v in properties.items() if k != "value_count"}


def _exportable_module(
    model: torch.nn.Module, input_schema: Schema, output_schema: Schema, wrapping: dict
) -> torch.nn.Module:
    """The eager ``model`` in the wire wrapper that torch.export compiles (one output: the
    wrapper that keeps its scores independent of the batch)."""
    arguments = bind_arguments(read_signature(model), input_schema, "PredictPytorch")
    wire_model = WireModel(DictCall(model, arguments, output_schema.column_names), **wrapping)
    return OneOutputWireModel(wire_model) if len(output_schema) == 1 else wire_model


def _check_exports(
    module: torch.nn.Module | None, schema: Schema, name: str, torchscript_failures: str
) -> None:
    """A ``ModelPreparationError`` unless torch.export takes ``module`` (no compile: seconds)."""
    from merlin_torch_serving.aot.compiling import export_program
    from merlin_torch_serving.aot.steps import EXAMPLE, tensors

    problem = (
        "cannot become TorchScript that answers like the eager module, which libtorch needs"
        f" without a package: {torchscript_failures}"
    )
    hint = (
        "run it eagerly on the python backend (backend='python'), or make it scriptable with"
        " torch.jit.script or exportable with torch.export"
    )
    if module is None:
        raise ModelPreparationError(name, problem + "; and compiled='torchscript' was asked", hint)
    try:
        export_program(module, tensors(wire.to_wire(sample_table(schema, *EXAMPLE))), name)
    except PackageError as error:
        raise ModelPreparationError(
            name, f"{problem}; nor can it be a package: {error}", hint
        ) from error


def _wire_module(model: torch.nn.Module, execution: str, wrapping: dict) -> torch.nn.Module:
    """``model`` wrapped to take wire tensors: scripted, as a ``OneOutputWireModel`` when it
    returns one tensor (its scores then do not depend on the batch), else as a ``WireModel``."""
    if execution != "torchscript":
        return WireModel(model, **wrapping)
    returns = getattr(getattr(model, "forward", None), "schema", None)
    if returns is not None and [str(r.type) for r in returns.returns] == ["Tensor"]:
        return torch.jit.script(OneOutputWireModel(WireModel(model, **wrapping)))
    return torch.jit.script(WireModel(model, **wrapping))
