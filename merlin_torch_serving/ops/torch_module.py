"""The TorchScript module that both Triton backends and in-process runs call: wire tensors in,
ragged lists padded to the model's sequence length, the model's outputs out.

Because the padding lives inside the scripted module, libtorch receives the wire tensors
(``c__values`` / ``c__offsets``) directly, and the python backend runs the very same graph.
"""


from typing import Dict, List

import torch


def pad_ragged(
    values: torch.Tensor,
    offsets: torch.Tensor,
    max_length: int,
    pad_value: float,
    pad_left: bool,
) -> torch.Tensor:
    """Dense ``[rows, max_length]`` from ragged values/offsets, keeping each row's last items.

    Rows longer than ``max_length`` keep their most recent ``max_length`` values (sessions are
    time-ordered, so the tail is what a next-item model needs); shorter rows are padded with
    ``pad_value`` on the right, or on the left when ``pad_left``.
    """
    offsets = offsets.to(torch.int64)
    ends = offsets[1:]
    lengths = torch.clamp(ends - offsets[:-1], max=max_length)
    rows = lengths.shape[0]
    dense = torch.full((rows, max_length), pad_value, dtype=values.dtype, device=values.device)
    if values.shape[0] == 0 or rows == 0:
        return dense
    positions = torch.arange(max_length, device=values.device).unsqueeze(0)
    if pad_left:
        # position p of a row of length n holds item n - max_length + p of its tail
        filled = positions >= (max_length - lengths).unsqueeze(1)
        source = ends.unsqueeze(1) - max_length + positions
    else:
        filled = positions < lengths.unsqueeze(1)
        source = (ends - lengths).unsqueeze(1) + positions
    source = torch.where(filled, source, torch.zeros_like(source))
    return torch.where(filled, values[source], dense)


def pad_dense(values: torch.Tensor, max_length: int, pad_value: float, pad_left: bool) -> torch.Tensor:
    """A fixed-length ``[rows, n]`` list brought to ``[rows, max_length]`` by the same rules."""
    length = values.shape[1]
    if length >= max_length:
        return values[:, length - max_length :]
    padding = torch.full(
        (values.shape[0], max_length - length), pad_value, dtype=values.dtype, device=values.device
    )
    return torch.cat([padding, values] if pad_left else [values, padding], dim=1)


class WireModel(torch.nn.Module):
    """Wraps a model that takes ``Dict[str, Tensor]`` of dense inputs so it takes wire tensors.

    ``ragged_inputs`` arrive as ``name__values`` / ``name__offsets`` (or, when an upstream step
    padded them already, as one dense ``name`` tensor) and are brought to the matching entry of
    ``max_lengths``; ``dense_inputs`` are passed through unchanged. The
    model's outputs are returned as the model returns them (one tensor or a tuple), which is
    what libtorch matches to the config's outputs by position.
    """

    ragged_inputs: List[str]
    max_lengths: List[int]
    dense_inputs: List[str]
    pad_value: float
    pad_left: bool

    def __init__(
        self,
        model: torch.nn.Module,
        ragged_inputs: List[str],
        max_lengths: List[int],
        dense_inputs: List[str],
        pad_value: float = 0.0,
        pad_left: bool = False,
    ):
        super().__init__()
        self.model = model
        self.ragged_inputs = ragged_inputs
        self.max_lengths = max_lengths
        self.dense_inputs = dense_inputs
        self.pad_value = pad_value
        self.pad_left = pad_left

    def forward(self, inputs: Dict[str, torch.Tensor]):
        features: Dict[str, torch.Tensor] = {}
        for i, name in enumerate(self.ragged_inputs):
            if name in inputs:
                features[name] = pad_dense(
                    inputs[name], self.max_lengths[i], self.pad_value, self.pad_left
                )
            else:
                features[name] = pad_ragged(
                    inputs[name + "__values"],
                    inputs[name + "__offsets"],
                    self.max_lengths[i],
                    self.pad_value,
                    self.pad_left,
                )
        for name in self.dense_inputs:
            features[name] = inputs[name]
        return self.model(features)
