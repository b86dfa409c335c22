"""Small models of the shapes users bring, for tests of PredictPytorch beyond Transformers4Rec.

They live in a module of their own, at module level, so the python backend can import them when
it unpickles an eager model (the server runs in the repository root, as the tests do).
"""

from __future__ import annotations

import torch
from merlin.schema import ColumnSchema, Schema

PRICES = ColumnSchema("price", dtype="float32", dims=(None, 3))
CLICKS = ColumnSchema(
    "clicks", dtype="int64", dims=(None,), properties={"domain": {"min": 0, "max": 20}}
)
POSITIONAL_INPUTS = Schema([PRICES, CLICKS])
POSITIONAL_OUTPUTS = Schema([ColumnSchema("score"), ColumnSchema("weighted")])


class PositionalScorer(torch.nn.Module):
    """``forward(price, clicks)``, one tensor per argument, two outputs as a tuple; the branch on
    the data is fine when scripted and wrong when traced."""

    def __init__(self):
        super().__init__()
        self.weights = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(
        self, price: torch.Tensor, clicks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weighted = price * self.weights
        score = weighted.sum(1) + clicks.to(torch.float32)
        if bool((score < 0).any()):
            score = score.abs()
        return score, weighted


class SignedRowSum(torch.nn.Module):
    """Each row's sum, made positive: a branch per row that a trace freezes on its example.

    ``inputs`` is not annotated, as in much eager code, so TorchScript takes it for a tensor and
    cannot script the model.
    """

    def forward(self, inputs):
        return torch.stack([row.sum() if row.sum() > 0 else -row.sum() for row in inputs["x"]])


class BatchSignBranch(torch.nn.Module):
    """One branch for the whole batch: a trace runs at every batch size and answers wrong values
    whenever the batch's sign differs from its example's."""

    def forward(self, inputs):
        x = inputs["x"]
        if x.sum() > 0:
            return x.sum(1)
        return -x.sum(1)


class CheckedInput(torch.nn.Module):
    """Refuses NaN inputs: tracing warns (a tensor turned into a Python bool) yet the trace is
    right on every valid input."""

    def forward(self, inputs):
        x = inputs["x"]
        if bool(torch.isnan(x).any()):
            raise ValueError("NaN in the input")
        return x * 3


class DictScores(torch.nn.Module):
    """Takes and returns dicts, as Merlin models do."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = inputs["x"]
        return {"total": x.sum(1), "largest": x.max(1).values}


SIGNED_INPUTS = Schema([ColumnSchema("x", dtype="float32", dims=(None, 4))])


class QueryTower(torch.nn.Module):
    """A model of its own making (not Transformers4Rec) that scores its catalog as a query vector
    times an item table and returns both: RetrieveTopK is given the query output by name and the
    table as the item vectors."""

    def __init__(self, n_items: int = 600, dimension: int = 8, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.encoder = torch.nn.Sequential(
                torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, dimension)
            )
            self.items = torch.nn.Embedding(n_items, dimension)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        query = self.encoder(inputs["x"])
        return {"query": query, "scores": query @ self.items.weight.t()}


QUERY_INPUTS = Schema([ColumnSchema("x", dtype="float32", dims=(None, 4))])
QUERY_OUTPUTS = Schema([ColumnSchema("query"), ColumnSchema("scores")])
