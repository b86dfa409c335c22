"""Noticing the moment a python-backend stub dies.

A dead stub keeps taking requests until its model is changed, so every millisecond between the
death and the switch to a standby (``launcher.failover``) may cost a request. The stubs are
watched through Linux process file descriptors, which the kernel makes readable the instant the
process ends; a stub started later (a reload, a new model) is found within ``refresh_s``. Where
pidfds are missing (Linux before 5.3, another OS), a death is seen at the next refresh.

A stub that ends is not always dead. tritonserver ends the stubs of a model it reloads or
unloads: it asks each to exit (code 0) or, when the stub missed the python backend's one-second
health check (a busy machine), kills it; and a stub can crash in its interpreter's teardown once
its model has let it go. In every such case tritonserver is waiting for the stub and collects it
at once. A stub that dies on its own (killed, out of memory, crashed in a request) is collected
by nobody: tritonserver waits for it only when its model is reloaded. So a stub that ends badly
is a death only if it is still uncollected ``COLLECT_GRACE_S`` later. The wait costs no request:
the instance of a dead stub holds each request it takes for the python backend's one-second
timeout before it fails it and takes the next. (Taken for a death anyway, a retired stub costs a
switch to the standby and back within seconds, see ``launcher.failover``.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable

from merlin_torch_serving.launcher.process import children_of, process_info
from merlin_torch_serving.launcher.stubs import Stub, stub_of

logger = logging.getLogger("merlin_torch_serving")

#: how long tritonserver may take to collect a stub it ended itself before the end is a death
COLLECT_GRACE_S = 0.25
_COLLECT_POLL_S = 0.01


class DeathWatch:
    """A thread that calls ``on_death(stub)`` when a stub of tritonserver ``server_pid`` ends."""

    def __init__(self, server_pid: int, on_death: Callable[[Stub], None], refresh_s: float = 0.5):
        self._server_pid = server_pid
        self._on_death = on_death
        self._refresh_s = refresh_s
        self._watched: dict[int, tuple[Stub, int | None]] = {}  # pid -> (stub, pidfd)
        self._ignored: set[int] = set()
        self._stop = threading.Event()
        # written to by stop(): wakes the poll at once
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(
            target=self._run, name=f"tritonserver-{server_pid}-stub-deaths", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        for descriptor in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(descriptor)
        for _, pidfd in self._watched.values():
            if pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(pidfd)
        self._watched.clear()

    def ignore(self, pid: int) -> None:
        """Stop watching stub ``pid``: its end is no death (the launcher ends it)."""
        self._ignored.add(pid)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._refresh()
            descriptors = {fd: pid for pid, (_, fd) in self._watched.items() if fd is not None}
            poller = select.poll()
            for descriptor in [*descriptors, self._wake_read]:
                poller.register(descriptor, select.POLLIN)
            for descriptor, _ in poller.poll(self._refresh_s * 1000):
                if descriptor in descriptors and not self._stop.is_set():
                    self._ended(descriptors[descriptor])

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


def _died(pid: int, grace_s: float = COLLECT_GRACE_S) -> bool:
    """Whether the ended stub ``pid`` died, rather than being retired by tritonserver (see the
    module's docstring): it was killed or failed, and nobody collects it within ``grace_s``. Until
    it is collected it stays a zombie, its wait status readable."""
    ended = process_info(pid, with_argv=False)
    if ended is None or ended.state not in ("Z", "X"):
        return False
    status = ended.exit_status
    if not (os.WIFSIGNALED(status) or (os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0)):
        return False  # exited by itself with code 0: retired
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        time.sleep(_COLLECT_POLL_S)
        if not _uncollected(pid):
            return False
    return True


def _uncollected(pid: int) -> bool:
    """Whether ``pid`` is still a zombie (a collected pid is gone, or another process's now)."""
    info = process_info(pid, with_argv=False)
    return info is not None and info.state in ("Z", "X")


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None
