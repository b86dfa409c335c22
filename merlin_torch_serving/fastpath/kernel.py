"""What a compiled step is: a function from one batch to another, and the two ways it can decline.

At compile time a kernel builder raises ``NotCompiled`` and the operator runs through NVTabular;
at run time a kernel raises ``Delegate`` for data it was not built for, and that one call does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from merlin_torch_serving.fastpath.batch import Batch


class Kernel(Protocol):
    """Computes what the operator's ``transform`` would return, as a batch."""

    def __call__(self, batch: Batch) -> Batch: ...


class NotCompiled(Exception):
    """An operator, or the way it is configured, has no compiled kernel; ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class Delegate(Exception):
    """This call's data is outside what the kernel reproduces exactly; NVTabular runs it instead."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)
