import numpy as np
import pytest
from merlin.dag import ColumnSelector
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving import Ensemble, SchemaError, TopK

CATALOG = 12


def scores_schema(catalog=CATALOG):
    return Schema([ColumnSchema("scores", dtype="float32", dims=(None, catalog))])


def random_scores(rows, catalog=CATALOG, seed=0):
    # distinct values, so the expected order has no ties
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(catalog) for _ in range(rows)]).astype(np.float32) / catalog


def brute_force_top_k(scores, k, excluded_per_row):
    ids, best = [], []
    for row, excluded in zip(scores, excluded_per_row, strict=True):
        candidates = [i for i in np.argsort(-row, kind="stable") if i not in excluded]
        ids.append(candidates[:k])
        best.append(row[candidates[:k]])
    return np.array(ids), np.array(best, dtype=np.float32)


def run(op, table):
    return op.transform(ColumnSelector(list(table.columns)), table)


def seen_schema(shape):
    return scores_schema() + Schema([ColumnSchema("item_id-list", dtype="int64", dims=shape)])


def test_topk_returns_the_k_best_ids_and_scores_per_row_best_first():
    scores = random_scores(5)
    result = run(TopK(3, exclude_ids=[0]), TensorTable({"scores": scores}))
    want_ids, want_scores = brute_force_top_k(scores, 3, [{0}] * 5)
    np.testing.assert_array_equal(result["item_ids"].values, want_ids)
    np.testing.assert_array_equal(result["item_scores"].values, want_scores)


def test_topk_leaves_out_items_already_in_the_ragged_session():
    scores = random_scores(3)
    seen = (np.array([4, 5, 1, 11, 3, 3]), np.array([0, 2, 2, 6], dtype=np.int32))
    graph = ["scores"] >> TopK(4, seen_items="item_id-list", exclude_ids=[0, 1, 2])
    result = Ensemble(graph, seen_schema((None, None))).run(
        TensorTable({"scores": scores, "item_id-list": seen})
    )
    excluded = [{0, 1, 2, 4, 5}, {0, 1, 2}, {0, 1, 2, 11, 3}]
    want_ids, _ = brute_force_top_k(scores, 4, excluded)
    np.testing.assert_array_equal(result["item_ids"].values, want_ids)


def test_topk_leaves_out_items_of_a_padded_session_list():
    scores = random_scores(2)
    graph = ["scores"] >> TopK(2, seen_items="item_id-list")
    table = TensorTable({"scores": scores, "item_id-list": np.array([[7, 8, 0], [9, 0, 0]])})
    result = Ensemble(graph, seen_schema((None, 3))).run(table)
    want_ids, _ = brute_force_top_k(scores, 2, [{7, 8, 0}, {9, 0}])
    np.testing.assert_array_equal(result["item_ids"].values, want_ids)


def test_topk_output_schema_is_k_wide_not_catalog_wide():
    ensemble = Ensemble(["scores"] >> TopK(5), scores_schema())
    assert ensemble.output_schema["item_ids"].shape.as_tuple == ((0, None), 5)
    assert ensemble.output_schema["item_scores"].dtype.name == "float32"


def test_topk_with_k_larger_than_the_catalog_is_a_clear_error():
    with pytest.raises(
        SchemaError,
        match=r"'scores' at the input of TopK\(k=13\): expected at least k=13 items.*catalog of 12",
    ):
        Ensemble(["scores"] >> TopK(13), scores_schema())


def test_topk_counts_excluded_ids_against_the_catalog():
    with pytest.raises(
        SchemaError, match="catalog of 12 item\\(s\\) of which 9 may be recommended"
    ):
        Ensemble(["scores"] >> TopK(10, exclude_ids=[0, 1, 2]), scores_schema())


def test_topk_with_k_equal_to_the_catalog_returns_every_item():
    scores = random_scores(1)
    ensemble = Ensemble(["scores"] >> TopK(CATALOG), scores_schema())
    result = ensemble.run(TensorTable({"scores": scores}))
    assert sorted(result["item_ids"].values[0].tolist()) == list(range(CATALOG))


def test_topk_rejects_scores_that_are_not_a_float_matrix():
    schema = Schema([ColumnSchema("scores", dtype="int64", dims=(None, CATALOG))])
    with pytest.raises(SchemaError, match="exactly one float column"):
        Ensemble(["scores"] >> TopK(3), schema)


def test_topk_needs_a_positive_k():
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        TopK(0)
