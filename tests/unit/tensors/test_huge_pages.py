"""Moving a large tensor onto huge pages keeps its values and address.

Small tensors and other systems than Linux are left alone; a storage several tensors share is
moved once.
"""

import sys

import torch

from merlin_torch_serving.tensors.huge_pages import collapse_onto_huge_pages

MB = 1 << 20


def test_a_large_tensor_keeps_its_values_and_address_and_at_most_its_size_is_moved():
    table = torch.randn(64 * MB // 4, generator=torch.Generator().manual_seed(0)).reshape(-1, 64)
    before, address = table.clone(), table.data_ptr()

    moved = collapse_onto_huge_pages([table], min_bytes=32 * MB)

    assert 0 <= moved <= table.untyped_storage().nbytes()
    assert moved % (2 * MB) == 0
    assert table.data_ptr() == address
    assert torch.equal(table, before)


def test_tensors_below_the_threshold_are_left_alone():
    assert collapse_onto_huge_pages([torch.ones(1024, 1024)], min_bytes=32 * MB) == 0


def test_views_of_one_storage_are_moved_once():
    table = torch.zeros(48 * MB // 4)
    collapse_onto_huge_pages([table], min_bytes=32 * MB)
    alone = collapse_onto_huge_pages([table], min_bytes=32 * MB)
    assert (
        collapse_onto_huge_pages([table, table[10:], table.view(-1, 4)], min_bytes=32 * MB) == alone
    )


def test_elsewhere_than_linux_nothing_is_moved(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert collapse_onto_huge_pages([torch.zeros(48 * MB // 4)], min_bytes=32 * MB) == 0
