"""The two-pass selection of long rows returns what torch.topk over the whole row returns."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_torch_serving.ops.topk import top_k_items
from merlin_torch_serving.retrieval.selection import BLOCK, MIN_ROW, best_of_rows

SCRIPTED = torch.jit.script(best_of_rows)


def assert_as_topk(scores, count, **sizes):
    want = torch.topk(scores, count, dim=1, largest=True, sorted=True)
    for select in (best_of_rows, SCRIPTED):
        values, ids = select(scores, count, **sizes)
        assert torch.equal(values, want.values)
        assert torch.equal(ids, want.indices)


@pytest.mark.parametrize("length", [MIN_ROW, MIN_ROW + 1, 300_007, 1_000_000])
@pytest.mark.parametrize("rows", [0, 1, 7])
def test_long_rows_give_torch_topk_values_and_ids(length, rows):
    scores = torch.randn(rows, length, generator=torch.Generator().manual_seed(length + rows))
    assert_as_topk(scores, 33)


def test_the_best_scores_all_in_one_block_or_in_the_last_few_are_found():
    scores = torch.randn(2, 300_007, generator=torch.Generator().manual_seed(0))
    scores[0, 5 * BLOCK : 6 * BLOCK] = torch.arange(BLOCK, dtype=torch.float32) + 10.0
    scores[1, -3:] = torch.tensor([20.0, 30.0, 25.0])  # after the last whole block
    assert_as_topk(scores, 40)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=64, max_size=300),
    st.integers(1, 7),
    st.integers(1, 8),
)
def test_small_blocks_give_the_values_of_torch_topk_and_ids_of_those_values(values, count, block):
    """Few distinct scores, so ties everywhere: the values are torch.topk's, and each id holds
    its value (among equal scores the order is free, as it is for torch.topk)."""
    scores = torch.tensor([values], dtype=torch.float32)
    count = min(count, scores.shape[1] // (8 * block)) or 1
    got_values, got_ids = best_of_rows(scores, count, block=block, min_row=1)
    want = torch.topk(scores, count, dim=1, largest=True, sorted=True)
    assert torch.equal(got_values, want.values)
    assert torch.equal(scores.gather(1, got_ids), got_values)
    assert len(set(got_ids[0].tolist())) == count


def test_top_k_items_of_a_long_row_leaves_out_excluded_and_seen_items():
    scores = torch.randn(3, 200_000, generator=torch.Generator().manual_seed(1))
    scores[:, :4] = 50.0  # the padding and reserved ids score best
    seen_values, seen_offsets = torch.tensor([9, 10, 11]), torch.tensor([0, 2, 2, 3])
    scores[0, 9] = scores[0, 10] = scores[2, 11] = 40.0  # so do seen items
    excluded = torch.tensor([0, 1, 2, 3])

    ids, values = top_k_items(scores, 10, excluded, seen_values, seen_offsets)

    masked = scores.clone()
    masked[:, :4] = float("-inf")
    masked[0, [9, 10]] = masked[2, 11] = float("-inf")
    want = torch.topk(masked, 10, dim=1)
    assert torch.equal(ids, want.indices)
    assert torch.equal(values, want.values)
