"""The batched wire form for libtorch steps: a module that takes and returns every tensor with the
leading dimension of 1 of a batched ensemble's requests, around the step's own module.

In a batched export the python steps batch across requests (see ``merging``), and so do libtorch
steps fed by one python step (``libtorch_batching``); any other libtorch step answers one request
at a time inside the same ensemble, so its tensors must have the shape the other steps send and
expect: ``[1, ...]``.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import torch

from merlin_torch_serving.exceptions import ExportError


def _inner(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    unbatched: dict[str, torch.Tensor] = {}
    for name, tensor in inputs.items():
        unbatched[name] = tensor[0]
    return unbatched


class OneRequestOne(torch.nn.Module):
    """Wraps a module of one output."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.inner(_inner(inputs)).unsqueeze(0)


class OneRequestPair(torch.nn.Module):
    """Wraps a module of two outputs."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = self.inner(_inner(inputs))
        return first.unsqueeze(0), second.unsqueeze(0)


def with_request_dim(
    module: torch.jit.ScriptModule, step: str, outputs: int
) -> torch.jit.ScriptModule:
    """``module`` (a scripted libtorch step of ``outputs`` outputs) in the batched wire form."""
    if outputs == 1:
        return torch.jit.script(OneRequestOne(module))
    if outputs == 2:
        return torch.jit.script(OneRequestPair(module))
    raise ExportError(
        f"step {step!r}: a libtorch step of {outputs} outputs cannot join a batched export (one "
        f"or two "
        "outputs can); export with ModelOptions(batching=False), or run that model on the python "
        "backend"
    )
