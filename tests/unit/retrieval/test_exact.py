"""The block-wise exact ranking gives the ids and scores of scoring the whole catalog and ranking
it with TopK's kernel, bit for bit, whatever the block size."""

import pytest
import torch

from merlin_torch_serving.ops.topk import top_k_items
from merlin_torch_serving.retrieval.exact import exact_top_k
from merlin_torch_serving.tensors.batch_invariance import MIN_ROWS, repeated_rows

CATALOG, DIMENSION = 2_003, 16
EXCLUDED = torch.tensor([0, 1, 2])


@pytest.fixture(scope="module")
def items():
    return torch.randn(CATALOG, DIMENSION, generator=torch.Generator().manual_seed(0))


def queries(rows, seed=1):
    return torch.randn(rows, DIMENSION, generator=torch.Generator().manual_seed(seed))


def catalog_scores(q, items):
    """``q @ items.T`` as a model computes it: never on fewer than MIN_ROWS rows."""
    rows = q.shape[0]
    if rows < MIN_ROWS:
        return (q[repeated_rows(rows)] @ items.t())[:rows]
    return q @ items.t()


@pytest.mark.parametrize("block_items", [1, 300, 512, 1_002, 1 << 20])
@pytest.mark.parametrize("rows", [1, 5])
def test_exact_top_k_equals_ranking_the_whole_catalog_for_any_block_size(items, block_items, rows):
    q = queries(rows)
    seen_values = torch.tensor([5, 1_999, 2_002, 17] * rows)[: 3 * rows]
    seen_offsets = torch.arange(0, 3 * rows + 1, 3)

    ids, scores = exact_top_k(q, items, 10, EXCLUDED, seen_values, seen_offsets, 0.0, block_items)
    want_ids, want_scores = top_k_items(
        catalog_scores(q, items), 10, EXCLUDED, seen_values, seen_offsets
    )

    assert torch.equal(ids, want_ids)
    assert torch.equal(scores, want_scores)


def test_exact_top_k_leaves_out_each_rows_seen_items_of_a_dense_list(items):
    q = queries(2)
    unmasked, _ = exact_top_k(q, items, 3, EXCLUDED, None, None)
    seen = torch.stack(
        [unmasked[0], torch.tensor([-1, CATALOG + 5, 0])]
    )  # out-of-catalog ids are ignored

    ids, _ = exact_top_k(q, items, 3, EXCLUDED, seen, None, 0.0, 100)

    assert not set(ids[0].tolist()) & set(unmasked[0].tolist())
    assert torch.equal(ids[1], unmasked[1])


def test_exact_top_k_divides_scores_by_the_temperature_as_the_model_does(items):
    q = queries(3)
    ids, scores = exact_top_k(q, items, 4, EXCLUDED, None, None, 0.7, 300)
    want_ids, want_scores = top_k_items(torch.div(catalog_scores(q, items), 0.7), 4, EXCLUDED)
    assert torch.equal(ids, want_ids)
    assert torch.equal(scores, want_scores)


def test_exact_top_k_marks_places_left_empty_when_fewer_items_remain():
    items = torch.eye(4)
    ids, scores = exact_top_k(torch.ones(1, 4), items, 3, torch.tensor([0, 1]), None, None)
    assert ids[0].tolist()[2] == -1
    assert scores[0, 2].item() == float("-inf")
    assert sorted(ids[0].tolist()[:2]) == [2, 3]


def test_exact_top_k_scripts_and_answers_the_same(items):
    scripted = torch.jit.script(exact_top_k)
    q = queries(4)
    seen = torch.tensor([[3, 4], [5, 6], [7, 8], [9, 10]])
    got = scripted(q, items, 5, EXCLUDED, seen, None, 0.0, 333)
    want = exact_top_k(q, items, 5, EXCLUDED, seen, None, 0.0, 333)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])
