"""The example's ranking model: one click probability per (session, candidate) row, from the
retrieval score, the candidate's features (category, price bucket, popularity, tags) and the
session's (its clicked categories, its device).

It is plain TorchScript-able PyTorch taking one ``Dict[str, Tensor]``: scalars ``[rows]``, the
lists padded ``[rows, length]`` (``PredictPytorch`` pads them), and returns float32 ``[rows]``.
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations as types

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema

from examples.ranking.model import train_on_inputs

OUTPUT_COLUMN = "click_probability"
#: how many of the session's last clicked categories the ranker reads, and tags per item
SESSION_CATEGORIES, TAGS = 20, 4


class Ranker(torch.nn.Module):
    """Embeddings of the candidate's category, price bucket, tags and the session's device; whether
    the candidate's category is the session's last or among its earlier ones; the retrieval score
    and popularity; an MLP over all of it."""

    def __init__(self, categories: int, price_buckets: int, tags: int, devices: int, dim: int = 8):
        super().__init__()
        self.category = torch.nn.Embedding(categories, dim)
        self.price = torch.nn.Embedding(price_buckets, dim)
        self.tags = torch.nn.Embedding(tags, dim, padding_idx=0)
        self.device = torch.nn.Embedding(devices, dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(4 * dim + 5, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        category = inputs["category"].clamp(0, self.category.num_embeddings - 1)
        clicked = inputs["category-list"]  # padded on the right with 0
        lengths = (clicked != 0).sum(1)
        last = clicked.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        same_as_last = ((category == last) & (lengths > 0)).to(torch.float32)
        share = ((clicked == category.unsqueeze(1)) & (clicked != 0)).sum(1).to(torch.float32)
        share = share / lengths.clamp(min=1).to(torch.float32)
        dense = torch.stack(
            [
                inputs["candidate_scores"].to(torch.float32),
                inputs["popularity"].to(torch.float32),
                same_as_last,
                share,
                torch.log1p(lengths.to(torch.float32)),
            ],
            dim=1,
        )
        tags = inputs["tags"].clamp(0, self.tags.num_embeddings - 1)
        vectors = [
            self.category(category),
            self.price(inputs["price_bucket"].clamp(0, self.price.num_embeddings - 1)),
            self.tags(tags).sum(1),
            self.device(inputs["device"].clamp(0, self.device.num_embeddings - 1)),
        ]
        return torch.sigmoid(self.mlp(torch.cat([dense] + vectors, dim=1)).squeeze(1))


def input_schema() -> Schema:
    """The ranker's inputs, as the pipeline's candidate rows carry them."""
    return Schema(
        [
            ColumnSchema("candidate_scores", dtype=np.float32, dims=(None,)),
            ColumnSchema("popularity", dtype=np.float32, dims=(None,)),
            ColumnSchema("category", dtype=np.int64, dims=(None,)),
            ColumnSchema("price_bucket", dtype=np.int64, dims=(None,)),
            ColumnSchema("device", dtype=np.int64, dims=(None,)),
            ColumnSchema("tags", dtype=np.int64, dims=(None, (0, TAGS))),
            ColumnSchema("category-list", dtype=np.int64, dims=(None, (0, SESSION_CATEGORIES))),
        ]
    )


def output_schema() -> Schema:
    return Schema([ColumnSchema(OUTPUT_COLUMN, dtype=np.float32, dims=(None,))])


def build_ranker(
    categories: int, price_buckets: int, tags: int, devices: int, *, seed: int = 0
) -> Ranker:
    """A ranker with weights fixed by ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Ranker(categories, price_buckets, tags, devices).eval()


def train(
    ranker: Ranker,
    inputs: dict[str, torch.Tensor],
    labels: np.ndarray,
    *,
    epochs: int = 4,
    batch_size: int = 512,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Binary cross-entropy with Adam over ``inputs`` (the forward's dict, padded); each epoch's
    mean loss (the ranking example's training loop)."""
    return train_on_inputs(
        ranker,
        inputs,
        labels,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
    )
