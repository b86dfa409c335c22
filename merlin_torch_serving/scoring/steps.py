"""One exported step, loaded from its files and called in this process as tritonserver calls it.

A python step is the same ``HostedStep`` its ``model.py`` hosts, with the row limit and torch
threads of its config. A libtorch step compiled ahead of time is its ``model.pt2`` package, called
by input name as the project's pytorch backend calls it. A TorchScript one is its ``model.pt``
called as Triton's pytorch backend calls it: one ``Dict[str, Tensor]`` keyed by the config's input
names, outputs matched by position, without gradients, in inference mode and without optimized
execution as its config says, with its ``INTRA_OP_THREAD_COUNT``; in a batched export, with the
leading dimension of 1 of the batched form (``export.request_dim``) or as a batch of one request
(``export.libtorch_batching``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from merlin_torch_serving.aot.package import CompiledPackage
from merlin_torch_serving.export.checks import THREAD_COUNT_PARAMETER
from merlin_torch_serving.export.config import (
    LIBTORCH_MODEL_FILE,
    MAX_BATCH_ROWS_PARAMETER,
    MAX_REQUEST_ROWS_PARAMETER,
    ROWS_TENSOR,
    TORCH_THREADS_PARAMETER,
)
from merlin_torch_serving.export.libtorch_batching import flat_batch
from merlin_torch_serving.export.python_model import HostedStep
from merlin_torch_serving.graph import answering
from merlin_torch_serving.graph.threads import torch_threads


class Step(Protocol):
    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The step's output tensors (by its own names) for its input tensors."""


def load_step(model_dir: Path, version: int, config, *, request_dim: bool) -> Step:
    """The step exported into ``model_dir`` (``version``), configured by ``config`` (its parsed
    config.pbtxt); ``request_dim``: the ensemble is batched (tensors travel as ``[1, ...]``)."""
    version_dir = model_dir / str(version)
    if config.backend == "pytorch" and config.default_model_filename.endswith(".pt2"):
        return PackageStep(version_dir / config.default_model_filename, config)
    if config.backend == "pytorch":
        return LibtorchStep(version_dir / LIBTORCH_MODEL_FILE, config, request_dim=request_dim)
    return PythonStep(version_dir, config)


class PythonStep:
    def __init__(self, version_dir: Path, config):
        max_rows = _parameter(config, MAX_REQUEST_ROWS_PARAMETER)
        max_batch_rows = _parameter(config, MAX_BATCH_ROWS_PARAMETER)
        self.threads = _parameter(config, TORCH_THREADS_PARAMETER)
        self.hosted = HostedStep.load(str(version_dir), config.name, max_rows, max_batch_rows)

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch_threads(self.threads):
            # scored sessions are shown to nobody: an answer log in the graph records none
            return self.hosted.run(arrays, answering.Answering(answering.SCORING))


class LibtorchStep:
    def __init__(self, model_path: Path, config, *, request_dim: bool):
        self.module = torch.jit.load(str(model_path), map_location="cpu")
        self.input_names = [spec.name for spec in config.input if spec.name != ROWS_TENSOR]
        self.output_names = [spec.name for spec in config.output]
        # a batched libtorch step fed by one python step takes a whole batch of requests at once
        self.merged = len(self.input_names) < len(config.input)
        self.request_dim = request_dim and not self.merged
        self.threads = _parameter(config, THREAD_COUNT_PARAMETER)
        parameters = config.parameters
        self.inference_mode = _flag(parameters, "INFERENCE_MODE", default=True)
        self.optimized_execution = not _flag(
            parameters, "DISABLE_OPTIMIZED_EXECUTION", default=False
        )

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = {name: arrays[name] for name in self.input_names}
        if self.merged:
            inputs = flat_batch([inputs])
        elif self.request_dim:
            inputs = {name: array[np.newaxis] for name, array in inputs.items()}
        tensors = {
            name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in inputs.items()
        }
        with (
            torch_threads(self.threads),
            torch.inference_mode(self.inference_mode),
            torch.no_grad(),
            torch.jit.optimized_execution(self.optimized_execution),
        ):
            result = self.module(tensors)
        results = result if isinstance(result, tuple) else (result,)
        outputs = {}
        for name, tensor in zip(self.output_names, results, strict=True):
            array = tensor.numpy()
            outputs[name] = array[0] if self.request_dim else array
        return outputs


class PackageStep:
    """A libtorch step's package: its inputs and outputs as the step's config names them (in a
    batched export, with the batched form's leading 1, which the package was compiled for)."""

    def __init__(self, package_path: Path, config):
        self.package = CompiledPackage(package_path, config.name)
        self.input_names = [spec.name for spec in config.input]
        self.output_names = [spec.name for spec in config.output]
        self.threads = _parameter(config, THREAD_COUNT_PARAMETER)

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {
            name: torch.from_numpy(np.ascontiguousarray(arrays[name])) for name in self.input_names
        }
        with torch_threads(self.threads):
            results = self.package(tensors)
        return {
            name: tensor.numpy() for name, tensor in zip(self.output_names, results, strict=True)
        }


def _parameter(config, name: str) -> int | None:
    value = config.parameters.get(name)
    return int(value.string_value) if value is not None and value.string_value else None


def _flag(parameters, name: str, default: bool) -> bool:
    value = parameters.get(name)
    return default if value is None else value.string_value.lower() == "true"
