"""Noticing the moment a python-backend stub dies.

A dead stub keeps taking requests until its model is changed, so every millisecond between the
death and the switch to a standby (``launcher.failover``) may cost a request. The stubs are
watched through Linux process file descriptors, which the kernel makes readable the instant the
process ends; a stub started later (a reload, a new model) is found within ``refresh_s``. Where
pidfds are missing (Linux before 5.3, another OS), a death is seen at the next refresh. A stub
that exits by itself with code 0 was retired (its model reloaded or unloaded): not a death.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable

from merlin_torch_serving.launcher.process import children_of, process_info
from merlin_torch_serving.launcher.stubs import Stub, stub_of

logger = logging.getLogger("merlin_torch_serving")


class DeathWatch:
    """A thread that calls ``on_death(stub)`` when a stub of tritonserver ``server_pid`` ends."""

    def __init__(self, server_pid: int, on_death: Callable[[Stub], None], refresh_s: float = 0.5):
        self._server_pid = server_pid
        self._on_death = on_death
        self._refresh_s = refresh_s
        self._watched: dict[int, tuple[Stub, int | None]] = {}  # pid -> (stub, pidfd)
        self._ignored: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"tritonserver-{server_pid}-stub-deaths", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        for _, descriptor in self._watched.values():
            if descriptor is not None:
                with contextlib.suppress(OSError):
                    os.close(descriptor)
        self._watched.clear()

    def ignore(self, pid: int) -> None:
        """Stop watching stub ``pid``: its end is no death (the launcher ends it)."""
        self._ignored.add(pid)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._refresh()
            descriptors = {fd: pid for pid, (_, fd) in self._watched.items() if fd is not None}
            if descriptors:
                poller = select.poll()
                for descriptor in descriptors:
                    poller.register(descriptor, select.POLLIN)
                for descriptor, _ in poller.poll(self._refresh_s * 1000):
                    self._ended(descriptors[descriptor])
            else:
                self._stop.wait(self._refresh_s)

    def _refresh(self) -> None:
        """Watch the stubs that appeared; a watched stub no longer alive has ended."""
        children = {process.pid: process for process in children_of(self._server_pid)}
        for pid in list(self._watched):
            process = children.get(pid)
            if process is None or not process.is_alive:
                self._ended(pid)
        for pid, process in children.items():
            if pid in self._watched or not process.is_alive or not process.argv:
                continue
            stub = stub_of(process)
            if stub is not None:
                self._watched[pid] = (stub, _pidfd(pid))

    def _ended(self, pid: int) -> None:
        stub, descriptor = self._watched.pop(pid, (None, None))
        if descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(descriptor)
        if stub is None or self._stop.is_set() or pid in self._ignored or not _died(pid):
            return
        try:
            self._on_death(stub)
        except Exception:  # the watch must go on for the other stubs
            logger.exception("handling the death of the stub of %r failed", stub.model)


def _died(pid: int) -> bool:
    """Whether the ended stub ``pid`` was killed or failed, rather than retired by its model's
    reload or unload (it then exits with code 0 and tritonserver collects it). A stub that dies
    stays a zombie until tritonserver collects it, its wait status readable meanwhile."""
    ended = process_info(pid, with_argv=False)
    if ended is None or ended.state not in ("Z", "X"):
        return False
    status = ended.exit_status
    return os.WIFSIGNALED(status) or (os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0)


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None
