"""The batched wire form for libtorch steps: a module that takes and returns every tensor with the
leading dimension of 1 of a batched ensemble's requests, around the step's own module.

In a batched export the python steps batch across requests (see ``merging``), and so do libtorch
steps fed by one python step (``libtorch_batching``); any other libtorch step answers one request
at a time inside the same ensemble, so its tensors must have the shape the other steps send and
expect: ``[1, ...]``.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import torch


def _inner(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    unbatched: dict[str, torch.Tensor] = {}
    for name, tensor in inputs.items():
        unbatched[name] = tensor[0]
    return unbatched


def with_request_dim(
    module: torch.jit.ScriptModule, step: str, outputs: int
) -> torch.jit.ScriptModule:
    """``module`` (a scripted libtorch step of ``outputs`` outputs) in the batched wire form."""
    if outputs == 1:
        returns, returned = "Tensor", "answer.unsqueeze(0)"
    else:
        returns = "Tuple[" + ", ".join(["Tensor"] * outputs) + "]"
        returned = ", ".join(f"answer[{i}].unsqueeze(0)" for i in range(outputs))
    source = "\n".join(
        [
            f"def forward(self, inputs: Dict[str, Tensor]) -> {returns}:",
            "    answer = self.inner(_inner(inputs))",
            f"    return {returned}",
            "",
        ]
    )

    # a class per module: TorchScript keeps the methods a ScriptModule defines on its class
    class OneRequest(torch.jit.ScriptModule):
        """Takes and returns every tensor with the batched form's leading 1."""

        def __init__(self):
            super().__init__()
            self.inner = module
            self.define(source)

    return OneRequest()
