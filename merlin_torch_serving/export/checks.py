"""The export-time check of a libtorch step: call ``model.pt`` the way Triton's pytorch backend
will (one ``Dict[str, Tensor]`` keyed by the config's input names, outputs matched by position)
and compare what comes back with the config, so a bad model fails the export, not the server."""

from __future__ import annotations

import os

import numpy as np
import torch

from merlin_torch_serving import wire
from merlin_torch_serving.exceptions import ModelCheckError


def check_libtorch_model(
    model_name: str, model_path: str | os.PathLike, config, arrays: dict[str, np.ndarray]
) -> None:
    """Call the model on ``arrays`` (its inputs in the wire format) and raise ``ModelCheckError``
    naming the first output whose count, dtype or dims disagree with ``config``."""
    module = torch.jit.load(os.fspath(model_path), map_location="cpu")
    inputs = {}
    for tensor in config.input:
        if tensor.name not in arrays:
            raise ModelCheckError(model_name, None, f"a sample for input {tensor.name!r}", "none")
        inputs[tensor.name] = torch.from_numpy(np.ascontiguousarray(arrays[tensor.name]))
    try:
        with torch.inference_mode():
            outputs = module(inputs)
    except Exception as exc:
        raise ModelCheckError(
            model_name, None, "a successful call with a Dict[str, Tensor] of its config inputs", f"{type(exc).__name__}: {exc}"
        ) from exc
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    declared = list(config.output)
    if len(outputs) != len(declared):
        raise ModelCheckError(
            model_name, None, f"{len(declared)} output(s) ({', '.join(o.name for o in declared)})", f"{len(outputs)}"
        )
    for spec, tensor in zip(declared, outputs):
        if not isinstance(tensor, torch.Tensor):
            raise ModelCheckError(model_name, spec.name, "a tensor", type(tensor).__name__)
        want_dtype = wire.numpy_dtype(_dtype_name(spec.data_type))
        got_dtype = np.dtype(str(tensor.dtype).removeprefix("torch."))
        if got_dtype != want_dtype:
            raise ModelCheckError(model_name, spec.name, f"dtype {want_dtype}", f"{got_dtype}")
        dims = list(spec.dims)
        shape = list(tensor.shape)
        if len(dims) != len(shape) or any(d != -1 and d != s for d, s in zip(dims, shape)):
            raise ModelCheckError(model_name, spec.name, f"dims {dims}", f"shape {shape}")


def _dtype_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(data_type)
