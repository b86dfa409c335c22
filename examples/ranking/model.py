"""A DLRM-style click-through-rate model: an embedding per categorical feature, an MLP over the
continuous ones, every pairwise dot product of those vectors, and a top MLP to one probability.

It is built from the workflow's output schema (cardinalities from the ``Categorify`` domains,
continuous columns from their tag), takes one ``Dict[str, Tensor]`` of the workflow's columns
(ids as int64 ``[batch]``, continuous values as floats ``[batch]``) and returns the click
probability of each row, float32 ``[batch]``. It is plain TorchScript-able PyTorch.
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations as types

import numpy as np
import pandas as pd
import torch
from merlin.schema import ColumnSchema, Schema, Tags

OUTPUT_COLUMN = "click_probability"


class DLRM(torch.nn.Module):
    """Embeddings + bottom MLP -> pairwise interactions -> top MLP -> sigmoid."""

    categorical: list[str]
    continuous: list[str]

    def __init__(
        self, cardinalities: dict[str, int], continuous: list[str], dim: int = 16, top: int = 64
    ):
        super().__init__()
        self.categorical = list(cardinalities)
        self.continuous = list(continuous)
        self.embeddings = torch.nn.ModuleList(
            [torch.nn.Embedding(n, dim) for n in cardinalities.values()]
        )
        self.bottom = torch.nn.Sequential(
            torch.nn.Linear(len(continuous), 32), torch.nn.ReLU(), torch.nn.Linear(32, dim)
        )
        n_vectors = len(cardinalities) + 1
        rows, columns = torch.triu_indices(n_vectors, n_vectors, offset=1)
        self.register_buffer("pair_rows", rows)
        self.register_buffer("pair_columns", columns)
        self.top = torch.nn.Sequential(
            torch.nn.Linear(dim + len(rows), top), torch.nn.ReLU(), torch.nn.Linear(top, 1)
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        dense = torch.stack([inputs[name].to(torch.float32) for name in self.continuous], dim=1)
        vectors = [self.bottom(dense)]
        for i, embedding in enumerate(self.embeddings):
            vectors.append(embedding(inputs[self.categorical[i]]))
        stacked = torch.stack(vectors, dim=1)  # [batch, features, dim]
        products = torch.bmm(stacked, stacked.transpose(1, 2))[:, self.pair_rows, self.pair_columns]
        logits = self.top(torch.cat([vectors[0], products], dim=1)).squeeze(1)
        return torch.sigmoid(logits)


def build_model(schema: Schema, *, dim: int = 16, seed: int = 0) -> DLRM:
    """The model for the workflow's output ``schema``; the same seed gives the same weights."""
    categorical = schema.select_by_tag(Tags.CATEGORICAL)
    continuous = schema.select_by_tag(Tags.CONTINUOUS)
    if not categorical or not continuous:
        raise ValueError(
            "the schema needs categorical and continuous columns (tagged so), got"
            f" {schema.column_names}; pass the output schema of the example's workflow"
        )
    cardinalities = {
        column.name: int(column.properties["domain"]["max"]) + 1 for column in categorical
    }
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return DLRM(cardinalities, continuous.column_names, dim=dim)


def output_schema() -> Schema:
    return Schema([ColumnSchema(OUTPUT_COLUMN, dtype=np.float32, dims=(None,))])


def model_inputs(model: DLRM, features: pd.DataFrame) -> dict[str, torch.Tensor]:
    """The columns ``model`` reads, from workflow output rows (what an eager caller passes)."""
    return {
        name: torch.from_numpy(features[name].to_numpy())
        for name in model.categorical + model.continuous
    }


def predict(model: DLRM, features: pd.DataFrame) -> np.ndarray:
    """Click probabilities of workflow output rows, computed eagerly."""
    with torch.no_grad():
        return model(model_inputs(model, features)).numpy()


def train(
    model: DLRM,
    features: pd.DataFrame,
    labels: np.ndarray,
    *,
    epochs: int = 5,
    batch_size: int = 256,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Train with binary cross-entropy and Adam; returns each epoch's mean loss."""
    return train_on_inputs(
        model,
        model_inputs(model, features),
        labels,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
    )


def train_on_inputs(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    labels: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
) -> list[float]:
    """Binary cross-entropy with Adam over a model taking one ``Dict[str, Tensor]`` of ``inputs``
    (a row per label), in shuffled batches; each epoch's mean loss."""
    targets = torch.from_numpy(np.asarray(labels, dtype=np.float32))
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    shuffle = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(targets), generator=shuffle)
        batch_losses = []
        for start in range(0, len(targets), batch_size):
            rows = order[start : start + batch_size]
            loss = torch.nn.functional.binary_cross_entropy(
                model({k: v[rows] for k, v in inputs.items()}), targets[rows]
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            batch_losses.append(loss.item())
        losses.append(float(np.mean(batch_losses)))
    model.eval()
    return losses


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance a random click outscores a random non-click."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    if labels.all() or not labels.any():
        raise ValueError("AUC needs both clicked and not clicked rows")
    ranks = pd.Series(scores).rank().to_numpy()  # ties share their mean rank
    positives = labels.sum()
    return float(
        (ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * (~labels).sum())
    )
