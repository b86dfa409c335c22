"""The session example's graph two ways, for the retrieval tests: scoring the whole catalog and
ranking it with TopK, or retrieving from an index queried with the session's vector (RetrieveTopK).
Both leave out the session's items and the reserved ids and decode the ids."""

from __future__ import annotations

import numpy as np

from merlin_torch_serving import DecodeItemIds, PredictPytorch, RetrieveTopK, TopK, TransformWorkflow
from tests.session_models import RESERVED_IDS

K = 10
#: recall@10 against exact that HNSWIndex() must reach over held-out sessions
RECALL_FLOOR = 0.95


def top_k_graph(workflow, t4r_model, backend=None):
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    ranked = features >> PredictPytorch(t4r_model, backend=backend) >> TopK(K, seen_items=features["item_id-list"], exclude_ids=RESERVED_IDS)
    return features["session_id"] + (ranked >> DecodeItemIds(workflow))


def retrieval_graph(workflow, t4r_model, index=None, backend=None):
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    retrieved = (
        features
        >> PredictPytorch(t4r_model, backend=backend, output="session_embedding")
        >> RetrieveTopK(K, t4r_model, index=index, seen_items=features["item_id-list"], exclude_ids=RESERVED_IDS)
    )
    return features["session_id"] + (retrieved >> DecodeItemIds(workflow))


def recall_at_k(found, exact) -> float:
    """Mean share of each row's exact ids that were found."""
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(found, exact)]))
