"""The fast path's own exceptions, and the one place they become the library's.

Two of them steer work and never leave the fast path: at compile time a kernel builder raises
``NotCompiled`` and the operator runs through NVTabular; at run time a kernel raises ``Delegate``
for data it was not built for, and that one call does. ``FastPathError`` is a workflow or request
the fast path cannot run at all; ``library_errors`` turns it into the library's ``WorkflowError``
where a caller enters the fast path (``compile_workflow``, ``CompiledWorkflow``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from merlin_torch_serving.exceptions import WorkflowError


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


class FastPathError(Exception):
    """The workflow cannot be compiled, or cannot transform this request, on the fast path."""


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """Raise the fast path's errors inside the block as ``WorkflowError``, the cause chained."""
    try:
        yield
    except FastPathError as error:
        raise WorkflowError(str(error)) from error
