"""RetrieveTopK served on the real tritonserver, gRPC and HTTP: the exact index (the XLNet's session
encoder on Triton's pytorch backend, retrieval on the python backend) answers TopK's ids and scores
for the same model; the HNSW index, loaded from the exported artifact by the model instance,
answers exactly as in-process, with its recall@10 against exact over held-out sessions reported
and at least the stated floor. A model of the user's own making, giving its query output and its
item table, is answered as TopK answers over its own scores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import Client, Ensemble, HNSWIndex, TritonExecutor
from tests import any_models
from tests.retrieval_graphs import (
    QUERY_REQUEST,
    RECALL_FLOOR,
    query_tower_graphs,
    query_tower_request,
    recall_at_k,
    retrieval_graph,
    top_k_graph,
)
from tests.session_models import request_rows

pytestmark = pytest.mark.integration

EXACT, APPROXIMATE = "retrieval_exact", "retrieval_hnsw"


@pytest.fixture(scope="module")
def ensembles(triton_server, pytorch_backend, session_workflow, xlnet):
    schema = session_workflow.input_schema
    served = {
        EXACT: Ensemble(retrieval_graph(session_workflow, xlnet.eager, backend="pytorch"), schema),
        APPROXIMATE: Ensemble(
            retrieval_graph(session_workflow, xlnet.eager, index=HNSWIndex(m=8, ef_search=16)),
            schema,
        ),
    }
    for name, ensemble in served.items():
        ensemble.export(triton_server.repository, name)
        triton_server.load(name)
    served["top_k"] = Ensemble(top_k_graph(session_workflow, xlnet.eager), schema)
    return served


def client(triton_server, protocol):
    return Client(
        triton_server.grpc_url if protocol == "grpc" else triton_server.http_url, protocol=protocol
    )


def assert_same_answer(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert got["session_id"].tolist() == want["session_id"].tolist()
    for name in ("item_ids", "item_scores"):
        np.testing.assert_array_equal(np.stack(got[name]), np.stack(want[name]), err_msg=name)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", [1, 32])
def test_served_exact_retrieval_returns_topks_ids_and_scores(
    triton_server, ensembles, session_split, protocol, n_sessions
):
    rows = request_rows(session_split[1], n_sessions, seed=10 + n_sessions)

    served = client(triton_server, protocol).infer(EXACT, rows)

    assert_same_answer(served, ensembles["top_k"].transform(rows))
    assert_same_answer(served, ensembles[EXACT].transform(rows))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_served_hnsw_retrieval_equals_in_process_and_reaches_the_recall_floor(
    triton_server, ensembles, session_split, protocol, record_property
):
    held_out = session_split[1]

    served = client(triton_server, protocol).infer(APPROXIMATE, held_out)

    assert_same_answer(served, ensembles[APPROXIMATE].transform(held_out))
    exact = ensembles["top_k"].transform(held_out)
    recall = recall_at_k(served["item_ids"], exact["item_ids"])
    record_property("served_hnsw_recall_at_10", recall)
    print(
        f"served HNSWIndex(m=8, ef_search=16) recall@10 against exact over {len(exact)} held-out"
        f" sessions: {recall:.4f}"
    )
    assert recall >= RECALL_FLOOR, f"recall@10 {recall:.4f} is below {RECALL_FLOOR}"


def test_served_retrieval_for_any_model_given_its_query_output_and_item_table_returns_topks_answer(
    triton_server, pytorch_backend
):
    tower = any_models.QueryTower(seed=7)
    ranked, retrieved = query_tower_graphs(tower, backend="pytorch")
    ensemble = Ensemble(retrieved, QUERY_REQUEST)
    ensemble.export(triton_server.repository, "retrieval_query_tower")
    triton_server.load("retrieval_query_tower")
    request = query_tower_request(tower, 25, seed=8)

    served = ensemble.run(
        request, executor=TritonExecutor(triton_server.grpc_url, "retrieval_query_tower")
    )

    want = Ensemble(ranked, QUERY_REQUEST).run(request)
    np.testing.assert_array_equal(served["item_ids"].values, want["item_ids"].values)
    np.testing.assert_array_equal(served["item_scores"].values, want["item_scores"].values)
