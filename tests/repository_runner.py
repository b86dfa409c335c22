"""Runs an exported model repository in this process, step by step, as tritonserver would: python
steps through the same ``HostedStep`` that ``model.py`` hosts, libtorch steps by calling
``model.pt`` with one ``Dict[str, Tensor]`` keyed by the config's input names (outputs matched by
position, inference mode, no optimized execution, as the step config asks), each with the torch
thread count its config asks for (a product split over another count of threads may round
differently), tensors routed by the ensemble config's input and output maps.

It checks mixed exports without starting a server (the served ones are tested on tritonserver
with Triton's pytorch backend too).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from merlin_torch_serving.data import wire
from merlin_torch_serving.export.checks import THREAD_COUNT_PARAMETER
from merlin_torch_serving.export.config import TORCH_THREADS_PARAMETER, from_pbtxt
from merlin_torch_serving.export.python_model import HostedStep
from merlin_torch_serving.graph.threads import torch_threads


def run_repository(
    repository: str | Path, ensemble: str, arrays: dict[str, np.ndarray], version: int = 1
) -> dict:
    """The ensemble's response tensors (by the names they travel under) for request ``arrays``."""
    repository = Path(repository)
    config = from_pbtxt((repository / ensemble / "config.pbtxt").read_text())
    tensors = dict(arrays)
    for step in config.ensemble_scheduling.step:
        model_dir = repository / step.model_name
        step_config = from_pbtxt((model_dir / "config.pbtxt").read_text())
        inputs = {
            model_name: tensors[ensemble_name]
            for model_name, ensemble_name in step.input_map.items()
        }
        libtorch = step_config.backend == "pytorch"
        threads = step_config.parameters.get(
            THREAD_COUNT_PARAMETER if libtorch else TORCH_THREADS_PARAMETER
        )
        with torch_threads(int(threads.string_value) if threads else None):
            if libtorch:
                outputs = _run_libtorch(model_dir / str(version) / "model.pt", step_config, inputs)
            else:
                outputs = HostedStep.load(str(model_dir / str(version))).run(inputs)
        for model_name, ensemble_name in step.output_map.items():
            tensors[ensemble_name] = outputs[model_name]
    return {output.name: tensors[output.name] for output in config.output}


def _run_libtorch(model_path: Path, config, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    module = torch.jit.load(str(model_path), map_location="cpu")
    tensors = {
        spec.name: torch.from_numpy(np.ascontiguousarray(inputs[spec.name]))
        for spec in config.input
    }
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        result = module(tensors)
    result = result if isinstance(result, tuple) else (result,)
    return {spec.name: tensor.numpy() for spec, tensor in zip(config.output, result, strict=True)}


def response_arrays(table, request_names) -> dict[str, np.ndarray]:
    """An in-process output table as the response tensors it travels as (``wire.response_name``)."""
    arrays = {}
    for name, column in table.items():
        sent = wire.response_name(name, request_names)
        if column.offsets is None:
            arrays[sent] = np.asarray(column.values)
        else:
            arrays[sent + wire.VALUES_SUFFIX] = np.asarray(column.values)
            arrays[sent + wire.OFFSETS_SUFFIX] = np.asarray(column.offsets).astype(
                wire.OFFSETS_DTYPE
            )
    return arrays
