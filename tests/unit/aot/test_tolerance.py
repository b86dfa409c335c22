"""How close a package must answer to its eager modules: floats within 1e-5 (relative above 1),
infinities and NaNs where eager has them; ids equal except where the scores around them tie within
that tolerance."""

from __future__ import annotations

import torch

from merlin_torch_serving.aot.tolerance import difference

NAMES = ["item_ids", "item_scores"]


def test_scores_within_the_tolerance_and_equal_ids_pass():
    scores = torch.tensor([[3.0, 2.0, 1.0]])
    ids = torch.tensor([[5, 6, 7]])
    assert difference([ids, scores], [ids, scores + 9e-6], NAMES) is None


def test_scores_off_by_more_than_the_tolerance_are_named_with_where_and_how_much():
    scores = torch.tensor([[3.0, 2.0, 1.0]])
    found = difference([scores], [scores + torch.tensor([[0.0, 0.0, 3e-5]])], ["item_scores"])
    assert found is not None
    assert found.startswith("output 'item_scores' differs by more than 1e-05 at [0, 2]")


def test_large_values_are_compared_relative_to_their_size():
    big = torch.tensor([1_000_000.0])
    assert difference([big], [big + 5.0], ["x"]) is None
    assert difference([big], [big + 20.0], ["x"]) is not None


def test_infinities_and_nans_must_be_where_eager_has_them():
    want = torch.tensor([float("-inf"), float("nan"), 1.0])
    assert difference([want], [want.clone()], ["x"]) is None
    assert difference([want], [torch.tensor([-1e30, float("nan"), 1.0])], ["x"]) is not None


def test_ids_swapped_between_near_tied_scores_pass():
    scores = torch.tensor([[3.0, 2.0, 2.000001, 1.0]])
    eager = torch.tensor([[5, 6, 7, 8]])
    compiled = torch.tensor([[5, 7, 6, 8]])
    assert difference([eager, scores], [compiled, scores], NAMES) is None


def test_the_last_id_may_differ_as_it_may_tie_with_the_first_one_left_out():
    scores = torch.tensor([[3.0, 2.0, 1.0]])
    assert (
        difference([torch.tensor([[5, 6, 7]]), scores], [torch.tensor([[5, 6, 9]]), scores], NAMES)
        is None
    )


def test_ids_that_differ_where_no_scores_tie_are_named():
    scores = torch.tensor([[3.0, 2.0, 1.0]])
    found = difference(
        [torch.tensor([[5, 6, 7]]), scores], [torch.tensor([[6, 5, 7]]), scores], NAMES
    )
    assert found is not None
    assert "output 'item_ids' differs at [0, 0] where no near tie explains it" in found


def test_other_outputs_must_be_equal_and_of_the_same_dtype_and_shape():
    assert difference([torch.tensor([1, 2])], [torch.tensor([1, 3])], ["x"]) is not None
    assert "is torch.int32 [2]" in difference(
        [torch.tensor([1, 2])], [torch.tensor([1, 2], dtype=torch.int32)], ["x"]
    )
