"""RetrieveTopK in-process: with the exact index it returns TopK's ids and scores for the same
model, exclusions and decoding included; with an approximate index its recall@10 against exact over
held-out sessions is reported and at least the stated floor."""

import numpy as np
import pytest
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from examples.session_based import model
from merlin_torch_serving import (
    Ensemble,
    HNSWIndex,
    IVFIndex,
    ModelPreparationError,
    PredictPytorch,
    RetrieveTopK,
    SchemaError,
    TransformWorkflow,
)
from tests import any_models
from tests.retrieval_graphs import (
    QUERY_REQUEST,
    RECALL_FLOOR,
    K,
    query_tower_graphs,
    query_tower_request,
    recall_at_k,
    retrieval_graph,
    top_k_graph,
)
from tests.session_models import MAX_SEQUENCE_LENGTH, RESERVED_IDS, request_rows


@pytest.mark.parametrize("name", ["xlnet", "gpt2"])
def test_exact_retrieval_returns_topks_ids_and_scores_for_the_same_model(
    request, session_workflow, session_split, name
):
    t4r_model = request.getfixturevalue(name).eager
    rows = request_rows(session_split[1], 48, seed=4)

    want = Ensemble(
        top_k_graph(session_workflow, t4r_model), session_workflow.input_schema
    ).transform(rows)
    got = Ensemble(
        retrieval_graph(session_workflow, t4r_model), session_workflow.input_schema
    ).transform(rows)

    assert got["session_id"].tolist() == want["session_id"].tolist()
    np.testing.assert_array_equal(np.stack(got["item_ids"]), np.stack(want["item_ids"]))
    np.testing.assert_array_equal(np.stack(got["item_scores"]), np.stack(want["item_scores"]))
    unfiltered = Ensemble(
        top_k_graph(session_workflow, t4r_model, exclusions=False), session_workflow.input_schema
    ).transform(rows)
    changed = [
        row
        for row, (a, b) in enumerate(zip(unfiltered["item_ids"], want["item_ids"], strict=True))
        if list(a) != list(b)
    ]
    assert changed, (
        "no session's answer is changed by leaving out its items and the reserved ids: the"
        " exclusions go untested"
    )


def test_hnsw_recall_at_10_against_exact_over_held_out_sessions(
    session_workflow, session_split, record_property
):
    # an untrained model with a catalog far larger than the workflow's: random item vectors, the
    # hardest case for an approximate index
    wide = model.build_model(
        session_workflow.output_schema,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        d_model=32,
        n_items=20_000,
        seed=5,
    ).eval()
    rows = session_split[1]
    features = session_workflow.input_schema.column_names >> TransformWorkflow(session_workflow)
    sessions = features >> PredictPytorch(wide, output="session_embedding")
    exact = RetrieveTopK(K, wide, seen_items=features["item_id-list"], exclude_ids=RESERVED_IDS)
    approximate = RetrieveTopK(
        K, wide, index=HNSWIndex(), seen_items=features["item_id-list"], exclude_ids=RESERVED_IDS
    )

    want = Ensemble(sessions >> exact, session_workflow.input_schema).transform(rows)
    got = Ensemble(sessions >> approximate, session_workflow.input_schema).transform(rows)

    recall = recall_at_k(got["item_ids"], want["item_ids"])
    record_property("hnsw_recall_at_10", recall)
    print(
        f"HNSWIndex() recall@10 against exact over {len(want)} held-out sessions, 20,000 items:"
        f" {recall:.4f}"
    )
    assert recall >= RECALL_FLOOR, (
        f"recall@10 {recall:.4f} over {len(want)} held-out sessions is below {RECALL_FLOOR}"
    )


def test_any_model_names_its_query_output_and_gives_its_item_table_and_answers_as_topk():
    tower = any_models.QueryTower()
    ranked, retrieved = query_tower_graphs(tower)
    request = query_tower_request(tower, 40, seed=1)

    want = Ensemble(ranked, QUERY_REQUEST).run(request)
    got = Ensemble(retrieved, QUERY_REQUEST).run(request)

    np.testing.assert_array_equal(got["item_ids"].values, want["item_ids"].values)
    np.testing.assert_array_equal(got["item_scores"].values, want["item_scores"].values)
    seen = request["seen"].values.reshape(-1, 3)
    assert not (got["item_ids"].values[:, :, None] == seen[:, None, :]).any()


def test_query_vectors_of_another_dimension_are_refused():
    schema = Schema([ColumnSchema("query", dtype="float32", dims=(None, 4))])
    with pytest.raises(
        SchemaError,
        match=(
            r"column 'query' at the input of RetrieveTopK\(k=3, exact\): expected float query"
            r" vectors of shape \[-1, 8\] \(the item vectors' dimension\), got float32 fixed list"
            r" \[-1, 4\]"
        ),
    ):
        Ensemble(["query"] >> RetrieveTopK(3, np.ones((50, 8), dtype=np.float32)), schema)


def test_two_float_vectors_need_the_query_named():
    schema = Schema([ColumnSchema(name, dtype="float32", dims=(None, 8)) for name in ("a", "b")])
    with pytest.raises(
        SchemaError,
        match=(
            r"exactly one float column of shape \[-1, 8\] to query the index with, got 2 \('a',"
            r" 'b'\); name it with RetrieveTopK\(..., query='column'\)"
        ),
    ):
        Ensemble(["a", "b"] >> RetrieveTopK(3, np.ones((50, 8), dtype=np.float32)), schema)


def test_more_items_than_the_catalog_can_recommend_are_refused():
    with pytest.raises(
        ValueError, match=r"k=9 is more than the 7 item\(s\) of the catalog that may be recommended"
    ):
        RetrieveTopK(9, np.ones((10, 4), dtype=np.float32), exclude_ids=[0, 1, 2])


def test_item_vectors_must_be_a_matrix():
    with pytest.raises(
        ValueError,
        match=(
            r"item_vectors must be a float \[catalog, d\] array or tensor .* got ndarray of shape"
            r" \(10,\)"
        ),
    ):
        RetrieveTopK(3, np.ones(10, dtype=np.float32))


def test_session_embedding_of_a_model_that_is_not_transformers4rec_says_what_to_do_instead():
    linear = torch.nn.Linear(4, 2)
    schema = Schema([ColumnSchema("x", dtype="float32", dims=(None, 4))])
    with pytest.raises(
        ModelPreparationError,
        match=r"is not a Transformers4Rec Model.*give a model whose output is the query vector",
    ):
        PredictPytorch(linear, schema, Schema([ColumnSchema("y")]), output="session_embedding")


def test_predict_pytorch_refuses_an_unknown_output():
    with pytest.raises(
        ValueError, match=r"output must be one of None, 'session_embedding', got 'hidden'"
    ):
        PredictPytorch(torch.nn.Linear(4, 2), output="hidden")


@pytest.mark.parametrize(
    "index",
    ["exact", HNSWIndex(m=8), IVFIndex(lists=16, probes=4, codes="sq8")],
    ids=["exact", "hnsw", "ivf-sq8"],
)
def test_an_exported_index_loads_with_its_step_answers_the_same_and_is_integrity_checked(
    index, tmp_path
):
    from merlin_torch_serving import ArtifactError
    from merlin_torch_serving.export.python_model import HostedStep

    item_vectors = np.random.default_rng(2).standard_normal((3_000, 8)).astype(np.float32)
    schema = Schema([ColumnSchema("query", dtype="float32", dims=(None, 8))])
    ensemble = Ensemble(
        ["query"] >> RetrieveTopK(5, item_vectors, index=index, exclude_ids=[0]), schema
    )
    ensemble.export(tmp_path, "retrieve")
    step_dir = tmp_path / "retrieve-0-retrievetopk" / "1"
    queries = np.random.default_rng(3).standard_normal((7, 8)).astype(np.float32)

    served = HostedStep.load(str(step_dir)).run({"query": queries})

    want = ensemble.run(TensorTable({"query": queries}))
    np.testing.assert_array_equal(served["item_ids"], want["item_ids"].values)
    np.testing.assert_array_equal(served["item_scores"], want["item_scores"].values)
    index_file = next((step_dir / "ops" / "0").iterdir())
    with open(index_file, "r+b") as file:
        file.seek(200)
        file.write(b"\x00\x01\x02\x03")
    with pytest.raises(
        ArtifactError,
        match=(
            rf"step 'retrieve-0-retrievetopk' cannot be loaded: its file .*{index_file.name}' has"
            r" sha256"
        ),
    ):
        HostedStep.load(str(step_dir))
