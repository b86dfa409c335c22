"""What a compiled step is: a function from one batch to another (see ``errors`` for the two ways it
can decline: ``NotCompiled`` at compile time, ``Delegate`` at run time)."""

from __future__ import annotations

from typing import Protocol

from merlin_torch_serving.fastpath.batch import Batch


class Kernel(Protocol):
    """Computes what the operator's ``transform`` would return, as a batch."""

    def __call__(self, batch: Batch) -> Batch: ...
