"""Giving a stub's free heap pages back to the OS once a big request is answered.

glibc keeps what a process freed for its next allocations: a request of a million clicks grows a
python-backend stub by hundreds of megabytes that it would then hold for good. The server starts
its stubs with malloc thresholds that return big buffers when they are freed
(``launcher.locate.allocator_environment``); the free pages left in the middle of the heaps are
returned here, after a request big enough to have made them (glibc's ``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterable, Mapping

import numpy as np

#: a request of this many rows (the longest tensor, clicks or list values) or more is followed
#: by ``malloc_trim``: about 4 ms per 100 MB it returns (measured on a heap of 200 MB, half of it
#: freed in 160 KB pieces), far below what such a request takes; one-session requests, most of the
#: traffic, never pay it
TRIM_AFTER_ROWS = 50_000


def rows(requests: Iterable[Mapping[str, np.ndarray]]) -> int:
    """The rows of a batch of requests: each request's longest tensor, summed."""
    return sum(
        max((len(array) for array in arrays.values() if array.ndim), default=0)
        for arrays in requests
    )


def release_after(rows_answered: int) -> bool:
    """Return the free pages of this process's heaps to the OS if ``rows_answered`` is big
    enough to have grown them; whether it tried (not on a C library without ``malloc_trim``)."""
    if rows_answered < TRIM_AFTER_ROWS:
        return False
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    if os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim
