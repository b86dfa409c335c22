"""Dense model inputs from workflow output rows, and a short training loop for the rebuilt models.

The official examples train with Transformers4Rec's Trainer and the Merlin dataloader, which pad
each list to the trainer's ``max_sequence_length`` on the right; this does the same on CPU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch


def padded(sessions: pd.DataFrame, columns: list[str], length: int) -> dict[str, torch.Tensor]:
    """Each list column as a ``[sessions, length]`` tensor: its last ``length`` values, zero-padded
    on the right (int64 for integer lists, float32 for float lists)."""
    inputs = {}
    for name in columns:
        rows = [np.asarray(row)[-length:] for row in sessions[name]]
        kind = np.result_type(*[row.dtype for row in rows]) if rows else np.dtype(np.int64)
        dtype = np.float32 if kind.kind == "f" else np.int64
        dense = np.zeros((len(rows), length), dtype=dtype)
        for position, row in enumerate(rows):
            dense[position, : len(row)] = row
        inputs[name] = torch.from_numpy(dense)
    return inputs


def train(
    model,
    sessions: pd.DataFrame,
    columns: list[str],
    length: int,
    *,
    epochs: int = 2,
    seed: int = 0,
) -> None:
    """A few epochs of Adam with masked language modeling, batches of 64.

    Leaves the model in eval mode.
    """
    inputs = padded(sessions, columns, length)
    count = len(sessions)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model.train()
        for _ in range(epochs):
            order = torch.randperm(count, generator=generator)
            for start in range(0, count, 64):
                rows = order[start : start + 64]
                loss = model(
                    {name: values[rows] for name, values in inputs.items()}, training=True
                )["loss"]
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    model.eval()
