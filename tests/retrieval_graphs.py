"""Graphs two ways, for the retrieval tests: scoring the whole catalog and ranking it with TopK, or
retrieving from an index queried with the query vector (RetrieveTopK). For the session example
(both leave out the session's items and the reserved ids and decode the ids) and for a model of
the user's own making that gives its query vector and its item table (``QueryTower``)."""

from __future__ import annotations

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import (
    DecodeItemIds,
    PredictPytorch,
    RetrieveTopK,
    TopK,
    TransformWorkflow,
)
from tests import any_models
from tests.session_models import RESERVED_IDS

K = 10
#: recall@10 against exact that HNSWIndex() must reach over held-out sessions
RECALL_FLOOR = 0.95


def top_k_graph(workflow, t4r_model, backend=None, exclusions=True):
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    excluded = (
        {"seen_items": features["item_id-list"], "exclude_ids": RESERVED_IDS} if exclusions else {}
    )
    ranked = features >> PredictPytorch(t4r_model, backend=backend) >> TopK(K, **excluded)
    return features["session_id"] + (ranked >> DecodeItemIds(workflow))


def retrieval_graph(workflow, t4r_model, index=None, backend=None):
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    retrieved = (
        features
        >> PredictPytorch(t4r_model, backend=backend, output="session_embedding")
        >> RetrieveTopK(
            K, t4r_model, index=index, seen_items=features["item_id-list"], exclude_ids=RESERVED_IDS
        )
    )
    return features["session_id"] + (retrieved >> DecodeItemIds(workflow))


def recall_at_k(found, exact) -> float:
    """Mean share of each row's exact ids that were found."""
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(found, exact, strict=True)]))


#: the request of the QueryTower graphs: its input and each row's seen items
QUERY_REQUEST = any_models.QUERY_INPUTS + Schema(
    [ColumnSchema("seen", dtype="int64", dims=(None, None))]
)


def query_tower_graphs(tower, backend=None):
    """(TopK over the tower's own scores, RetrieveTopK over its item table queried with its query
    output), both leaving out each row's seen items and id 0."""
    predicted = ["x"] >> PredictPytorch(
        tower, any_models.QUERY_INPUTS, any_models.QUERY_OUTPUTS, backend=backend
    )
    ranked = predicted >> TopK(K, scores="scores", seen_items="seen", exclude_ids=[0])
    retrieved = predicted >> RetrieveTopK(
        K, tower.items.weight, query="query", seen_items="seen", exclude_ids=[0]
    )
    return ranked, retrieved


def query_tower_request(tower, rows: int, seed: int) -> TensorTable:
    """Random inputs; each row has seen its own best and fourth-best items and an id outside the
    catalog, so the exclusions change the answer."""
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        best = torch.topk(tower({"x": x})["scores"], 4, dim=1).indices
    outside = torch.full((rows,), tower.items.num_embeddings + 3)
    seen = torch.stack([best[:, 0], best[:, 3], outside], dim=1).reshape(-1).numpy()
    return TensorTable(
        {"x": x.numpy(), "seen": (seen, np.arange(0, len(seen) + 1, 3, dtype=np.int32))}
    )
