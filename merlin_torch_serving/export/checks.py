"""Export-time checks of libtorch steps against the contract of Triton's pytorch backend (release
r24.10, ``src/libtorch.cc``), so a model the backend would refuse, misread or crash on fails the
export rather than the server:

- inputs and outputs are BOOL, UINT8, INT8/16/32/64 or FP16/32/64 (no UINT16/32/64, no BYTES);
- ``forward`` takes one ``Dict[str, Tensor]`` keyed by the config's input names and returns a
  Tensor or a tuple of Tensors (a ``List[Tensor]`` crashes the server at warm-up, a Dict is
  refused);
- outputs are matched by position, unless every output name ends in ``__<digits>``: then by that
  index, which must then equal the position;
- ``INTRA_OP_THREAD_COUNT`` sets torch's threads for the whole server process, so libtorch models
  of one repository that ask for different counts get whichever loaded last (a warning).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch
from google.protobuf import text_format
from merlin.schema import Schema
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import ModelCheckError
from merlin_torch_serving.export.config import from_pbtxt

#: the dtypes the backend maps to torch types
LIBTORCH_DTYPES = ("BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")
THREAD_COUNT_PARAMETER = "INTRA_OP_THREAD_COUNT"
_INDEX_SEPARATOR = "__"


def check_libtorch_schemas(model_name: str, input_schema: Schema, output_schema: Schema) -> None:
    """Raise ``ModelCheckError`` for the first column whose dtype the backend cannot carry."""
    for kind, schema in (("input", input_schema), ("output", output_schema)):
        for column in schema:
            for spec in wire.column_specs(column):
                if spec.triton_dtype not in LIBTORCH_DTYPES:
                    tensor = f"{kind} column {column.name!r}" + (
                        f" (tensor {spec.name!r})" if spec.name != column.name else ""
                    )
                    raise ModelCheckError(
                        model_name,
                        tensor,
                        f"a dtype Triton's pytorch backend accepts ({', '.join(LIBTORCH_DTYPES)})",
                        f"{spec.triton_dtype} ({spec.dtype})",
                        "cast the column to a signed integer or float type before this step (for"
                        " example in the workflow), or run the step's model on the python backend"
                        " (its operator's backend='python')",
                    )


def check_libtorch_model(
    model_name: str, model_path: str | os.PathLike, config, arrays: dict[str, np.ndarray]
) -> None:
    """Call ``model.pt`` on ``arrays`` (its inputs in the wire format) as the backend will and raise
    ``ModelCheckError`` where it disagrees with ``config``."""
    module = torch.jit.load(os.fspath(model_path), map_location="cpu")
    check_libtorch_return_type(model_name, module)
    inputs = {}
    for tensor in config.input:
        if tensor.name not in arrays:
            raise ModelCheckError(model_name, None, f"a sample for input {tensor.name!r}", "none")
        inputs[tensor.name] = torch.from_numpy(np.ascontiguousarray(arrays[tensor.name]))
    for batch_input in config.batch_input:  # what Triton computes per batch (the rows per request)
        for name in batch_input.target_name:
            inputs[name] = torch.from_numpy(np.ascontiguousarray(arrays[name]))
    try:
        with torch.inference_mode():
            outputs = module(inputs)
    except Exception as exc:
        raise ModelCheckError(
            model_name,
            None,
            "a successful call with a Dict[str, Tensor] of its config inputs",
            f"{type(exc).__name__}: {exc}",
        ) from exc
    if isinstance(outputs, (list, dict)):
        raise _unsupported_return(model_name, type(outputs).__name__)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    declared = list(config.output)
    if len(outputs) != len(declared):
        raise ModelCheckError(
            model_name,
            None,
            f"{len(declared)} output(s) ({', '.join(o.name for o in declared)})",
            f"{len(outputs)}",
        )
    _check_named_indexes(model_name, [spec.name for spec in declared])
    for spec, tensor in zip(declared, outputs, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise ModelCheckError(
                model_name, f"output {spec.name!r}", "a tensor", type(tensor).__name__
            )
        want_dtype = wire.numpy_dtype(model_config_pb2.DataType.Name(spec.data_type))
        got_dtype = wire.tensor_numpy_dtype(tensor.dtype)
        if got_dtype != want_dtype:
            raise ModelCheckError(
                model_name, f"output {spec.name!r}", f"dtype {want_dtype}", f"{got_dtype}"
            )
        dims = list(spec.dims)
        shape = list(tensor.shape)
        if len(dims) != len(shape) or any(
            d != -1 and d != s for d, s in zip(dims, shape, strict=True)
        ):
            raise ModelCheckError(
                model_name, f"output {spec.name!r}", f"dims {dims}", f"shape {shape}"
            )


def warn_about_differing_thread_counts(repository: str | os.PathLike) -> None:
    """Warn when the repository's libtorch models ask for different ``INTRA_OP_THREAD_COUNT``s.

    The backend applies the setting with ``at::set_num_threads``, which is process-wide: every
    libtorch model of the server then runs with the count of whichever model loaded last.
    """
    counts: dict[str, str] = {}
    for config_path in sorted(Path(repository).glob("*/config.pbtxt")):
        config = _read_config(config_path)
        if config is None or config.backend != "pytorch":
            continue
        parameter = config.parameters.get(THREAD_COUNT_PARAMETER)
        counts[config.name or config_path.parent.name] = (
            parameter.string_value if parameter else "torch's default"
        )
    if len(set(counts.values())) > 1:
        asked = ", ".join(f"{name!r}: {count}" for name, count in counts.items())
        warnings.warn(
            f"the repository's libtorch models ask for different {THREAD_COUNT_PARAMETER}s"
            f" ({asked}); Triton's pytorch backend sets torch's threads for the whole server"
            " process, so all of them run with the count of whichever model loads last. Export"
            " them with the same ModelOptions(torch_threads=...)",
            UserWarning,
            stacklevel=4,  # the caller of Ensemble.export
        )


def check_libtorch_return_type(model_name: str, module) -> None:
    """Refuse a forward declared to return a List or Dict, before anything is compiled around it."""
    returns = module.forward.schema.returns
    kind = returns[0].type.kind() if len(returns) == 1 else None
    if kind in ("ListType", "DictType"):
        raise _unsupported_return(model_name, str(returns[0].type))


def _unsupported_return(model_name: str, returned: str) -> ModelCheckError:
    return ModelCheckError(
        model_name,
        None,
        "forward() to return a Tensor or a tuple of Tensors",
        f"a {returned}",
        "Triton's pytorch backend crashes on a List[Tensor] at warm-up and refuses a Dict; return a"
        " tuple (e.g. `return (scores, ids)`)",
    )


def _check_named_indexes(model_name: str, names: list[str]) -> None:
    """When every output name ends in ``__<digits>``, the backend reads output ``i`` from the
    model's ``i``-th result, whatever the config's order: the two must then agree."""
    indexes = _named_indexes(names)
    if indexes is None:
        return
    for position, (name, index) in enumerate(zip(names, indexes, strict=True)):
        if index != position:
            raise ModelCheckError(
                model_name,
                f"output {name!r}",
                f"to be the model's result number {index}, since every output name ends in"
                " '__<index>' and Triton's pytorch backend then matches outputs by that index",
                f"it at position {position}",
                "rename the output columns so that not all of them end in '__<digits>', or make"
                " each index match the position the model returns it at",
            )


def _named_indexes(names: list[str]) -> list[int] | None:
    """The indexes the backend reads from output names, or None when it matches by position.

    As libtorch.cc does: split at the first ``__``; every remainder must be digits only (an empty
    one counts as 0).
    """
    indexes = []
    for name in names:
        split = name.find(_INDEX_SEPARATOR)
        if split == -1:
            return None
        rest = name[split + len(_INDEX_SEPARATOR) :]
        if not all(character.isdigit() for character in rest):
            return None
        indexes.append(int(rest) if rest else 0)
    return indexes


def _read_config(path: Path) -> model_config_pb2.ModelConfig | None:
    try:
        return from_pbtxt(path.read_text())
    except text_format.ParseError:  # not ours to judge; Triton reports configs it cannot parse
        return None
