"""torch's intra-op thread count for a block of work: every executor and served step runs its
operators on the thread budget it was given, not on every core of the machine."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch's intra-op thread count set to ``count`` inside the block (unchanged for None)."""
    import torch

    previous = torch.get_num_threads()
    if count is None or count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
