"""Executing notebooks in tests: a kernel on this interpreter, whatever kernelspecs exist."""

from __future__ import annotations

import re
import sys

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # IPython colours its tracebacks


def kernel_on_this_python() -> AsyncKernelManager:
    """A manager for the notebook's `python3` kernel that runs ipykernel on ``sys.executable``.

    With no kernel folders to search, jupyter_client falls back to ipykernel's own spec, which
    launches the running interpreter; an installed `python3` spec could name another Python.
    """
    manager = AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[])
    )
    if manager.kernel_spec.argv[0] != sys.executable:
        raise RuntimeError(
            f"the notebook kernel would run {manager.kernel_spec.argv[0]!r}, not this Python "
            f"({sys.executable!r}); ipykernel must be installed in the test environment"
        )
    return manager
