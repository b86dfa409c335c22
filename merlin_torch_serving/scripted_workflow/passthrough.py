"""Kernels of operators that only pass columns on: selections, ``+``/``[]``/``-`` nodes, tags,
renames (the TorchScript counterparts of ``fastpath.passthrough``)."""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import torch


class Identity(torch.nn.Module):
    """Returns its input unchanged, as the base ``Operator.transform`` and ``AddMetadata`` do."""

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        return values, offsets, rows


class Select(torch.nn.Module):
    """Returns the named columns under new names (``sources[i]`` as ``targets[i]``)."""

    sources: list[str]
    targets: list[str]

    def __init__(self, sources: list[str], targets: list[str]):
        super().__init__()
        self.sources = list(sources)
        self.targets = list(targets)

    def forward(
        self, values: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor], rows: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        selected: dict[str, torch.Tensor] = {}
        selected_offsets: dict[str, torch.Tensor] = {}
        for position in range(len(self.sources)):
            source, target = self.sources[position], self.targets[position]
            selected[target] = values[source]
            if source in offsets:
                selected_offsets[target] = offsets[source]
        return selected, selected_offsets, rows
