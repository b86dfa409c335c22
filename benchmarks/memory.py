"""Server memory: the resident set of tritonserver plus every process it started (the
python-backend stubs, one per model instance), sampled while a measurement runs.
"""

from __future__ import annotations

import threading

import psutil

_SAMPLE_INTERVAL_S = 0.2


def server_processes(server_pid: int) -> list[psutil.Process]:
    """tritonserver and its descendants; processes that end while being listed are left out."""
    try:
        root = psutil.Process(server_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def server_rss_bytes(server_pid: int) -> int:
    """Sum of the RSS of tritonserver and its children. Pages the stubs share (torch, numpy) are
    counted once per process, as the operating system reports them."""
    total = 0
    for process in server_processes(server_pid):
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


class PeakServerMemory:
    """Samples the server's RSS in a background thread while the ``with`` block runs; ``peak_bytes``
    is the largest sample (taken at least once at the start and once at the end)."""

    def __init__(self, server_pid: int, interval_s: float = _SAMPLE_INTERVAL_S):
        self.server_pid = server_pid
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakServerMemory:
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        self.peak_bytes = max(self.peak_bytes, server_rss_bytes(self.server_pid))
