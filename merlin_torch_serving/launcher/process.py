"""The tritonserver child process as the operating system sees it: started so that it dies with
this process, its process group signalled and waited for, and what /proc says about it and its
children (the python-backend stubs).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from merlin_torch_serving.launcher import private_memory

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_SIG_DFL = 0  # from <signal.h>
_POLL_S = 0.05


class ProcessKeeper:
    """A thread that starts child processes and lives until ``close()``.

    Linux sends a child its parent-death signal when the *thread* that forked it ends, not when
    the process does. A server started from a short-lived thread (a web handler, a worker of a
    pool) would be killed, silently, as soon as that thread returned. Children started here are
    forked by this thread instead, which the owner closes only once they are gone; it is a daemon
    thread, so it never keeps the interpreter alive, and when the process exits the children
    still receive SIGKILL.
    """

    def __init__(self, name: str):
        self._requests: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def popen(self, command: list[str], **options) -> subprocess.Popen:
        """``subprocess.Popen(command, **options)``, forked by the keeper thread.

        The child is killed with this process.
        """
        done: queue.Queue = queue.Queue(maxsize=1)
        self._requests.put((command, options, done))
        outcome = done.get()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self) -> None:
        """End the thread; call it only once every child it started has exited."""
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join()

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            command, options, done = request
            try:
                done.put(
                    subprocess.Popen(command, preexec_fn=prepare_child(os.getpid()), **options)
                )
            except BaseException as error:  # handed to the caller's thread
                done.put(error)


@dataclass(frozen=True)
class ProcessInfo:
    """One process, as /proc/<pid>/stat and cmdline describe it."""

    pid: int
    parent: int
    group: int
    state: str  # R, S, D, T (stopped), Z (zombie: exited, not reaped), ...
    exit_status: int  # wait status, meaningful for zombies
    argv: tuple[str, ...]  # empty for zombies

    @property
    def is_alive(self) -> bool:
        """Running or sleeping: not exited, not stopped (a stopped process answers nothing)."""
        return self.state not in ("Z", "X", "T", "t")


def process_info(pid: int, *, with_argv: bool = True) -> ProcessInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes() if with_argv else b""
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces; fixed fields follow it.
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessInfo(
        pid=pid,
        parent=int(fields[1]),
        group=int(fields[2]),
        state=fields[0],
        exit_status=int(fields[49]) if len(fields) > 49 else 0,
        argv=tuple(part.decode(errors="replace") for part in argv.split(b"\0") if part),
    )


def all_processes(*, with_argv: bool = False) -> list[ProcessInfo]:
    infos = (
        process_info(int(entry), with_argv=with_argv)
        for entry in os.listdir("/proc")
        if entry.isdigit()
    )
    return [info for info in infos if info is not None]


def children_of(pid: int) -> list[ProcessInfo]:
    """The processes whose parent is ``pid``, with their command lines."""
    children = (process_info(info.pid) for info in all_processes() if info.parent == pid)
    return [info for info in children if info is not None]


def describe_exit(status: int) -> str:
    """A wait status in words: 'killed by SIGKILL', 'exited with code 1'."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"ended (wait status {status})"


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def prepare_child(parent_pid: int) -> Callable[[], None]:
    """A preexec_fn that makes the child receive SIGKILL when its parent thread dies (Linux),
    takes SIGINT's default action whatever this process does with it, and keeps what it shares
    through /dev/shm to its user (``launcher.private_memory``).

    A process started as a shell's background job (``python serve.py &`` in a script) ignores
    SIGINT, and a child inherits that across exec: the graceful stop's SIGINT would never reach
    tritonserver, which would then always wait out the stop timeout and be killed.
    """
    libc = _libc()  # loaded before fork: the child should do as little as possible
    default_action = ctypes.c_void_p(_SIG_DFL)
    restrict = private_memory.restrictor()

    def prepare() -> None:
        libc.signal(signal.SIGINT, default_action)  # libc's: Python's is for the main thread only
        restrict()
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        # The parent may have died between fork and prctl; the signal would then never come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return prepare


def signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


def wait_for_group_exit(group: int, timeout_s: float) -> list[int]:
    """Wait until no live process is left in ``group``; return those still alive at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        members = live_group_members(group)
        if not members or time.monotonic() >= deadline:
            return members
        time.sleep(_POLL_S)


def live_group_members(group: int) -> list[int]:
    """Pids in process group ``group`` that are not zombies (zombies hold no resources)."""
    return [
        info.pid for info in all_processes() if info.group == group and info.state not in ("Z", "X")
    ]


def ports_listened_by(pid: int | None) -> set[int]:
    """TCP ports on which process ``pid`` holds a listening socket (read from /proc)."""
    if pid is None:
        return set()
    socket_inodes = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith("socket:["):
            socket_inodes.add(target[len("socket:[") : -1])
    return {
        port for port, inode in _listening_sockets(f"/proc/{pid}/net") if inode in socket_inodes
    }


def listening_ports() -> set[int]:
    """The TCP ports some process of this machine (this network namespace) listens on."""
    return {port for port, _ in _listening_sockets("/proc/net")}


def pid_exists(pid: int) -> bool:
    """Whether process ``pid`` exists (running, or a zombie not yet collected)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def _listening_sockets(net: str) -> list[tuple[int, str]]:
    """(port, socket inode) of every listening TCP socket in ``<net>/tcp`` and ``tcp6``."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(net, table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local_address is HEXADDR:HEXPORT, state 0A is LISTEN, the inode is the 10th field
            if len(fields) > 9 and fields[3] == "0A":
                found.append((int(fields[1].rsplit(":", 1)[1], 16), fields[9]))
    return found
