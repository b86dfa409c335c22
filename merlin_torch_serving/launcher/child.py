"""One tritonserver child process: started so that it dies with this process, its exit seen
without reaping it, and stopped together with every process of its group; and the log it writes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from merlin_torch_serving.exceptions import ServerError
from merlin_torch_serving.launcher.process import (
    ProcessKeeper,
    live_group_members,
    ports_listened_by,
    signal_group,
    wait_for_group_exit,
)

#: how long a process group may take to go after SIGKILL before that is an error
GROUP_EXIT_TIMEOUT_S = 5.0
_SHARED_MEMORY_DIR = Path("/dev/shm")
_EXIT_POLL_S = 0.05


class ServerLog:
    """The file the server writes its stdout and stderr to: ``path``, or a temporary file removed
    when this object goes. Each start truncates it."""

    def __init__(self, path: Path | None = None):
        self._path = path

    @property
    def path(self) -> Path | None:
        """Where the log is; None before the first start when it is a temporary file."""
        return self._path

    def open_for_writing(self) -> IO[bytes]:
        if self._path is None:
            descriptor, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(descriptor)
            self._path = Path(name)
            weakref.finalize(self, _remove_quietly, self._path)
        try:
            return open(self._path, "wb")
        except OSError as error:
            raise ServerError(
                f"could not open the server log {str(self._path)!r}: {error}; pass a writable"
                " log_path"
            ) from error

    def text(self) -> str:
        """Everything in the log."""
        return self.since(0)

    def size(self) -> int:
        """Where the log ends now: pass it to ``since()`` to read what comes after."""
        try:
            return self._path.stat().st_size if self._path is not None else 0
        except OSError:
            return 0

    def since(self, offset: int) -> str:
        """What the server wrote from byte ``offset`` on."""
        if self._path is None:
            return ""
        try:
            with open(self._path, "rb") as log:
                log.seek(offset)
                return log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""


class ServerProcess:
    """A running tritonserver, in a process group of its own.

    It is forked by a thread of its own (so it lives on when the thread that started it ends)
    and is killed when this process dies, see ``ProcessKeeper``. ``shm_prefix`` names the
    python-backend shared memory it was given, removed once its group is gone (None: the caller's).
    """

    def __init__(
        self,
        command: list[str],
        log: ServerLog,
        environment: Mapping[str, str],
        shm_prefix: str | None = None,
    ):
        self.shm_prefix = shm_prefix
        self._log_file = log.open_for_writing()
        self._keeper: ProcessKeeper | None = ProcessKeeper(f"tritonserver-keeper-{os.getpid()}")
        try:
            self._process = self._keeper.popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=dict(environment),
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as error:
            self._log_file.close()
            self._keeper.close()
            raise ServerError(f"could not run {command[0]!r}: {error}") from error
        self.pid = self._process.pid

    def exit_code(self) -> int | None:
        """The exit code once it has ended (negative: the signal that ended it), without reaping it:
        until it is reaped its pid, which is also its group's id, cannot go to another process."""
        if self._process.returncode is not None:
            return self._process.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self._process.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def listening_ports(self) -> set[int]:
        """The TCP ports it listens on: proof that the ports are its own, not a stranger's."""
        return ports_listened_by(self.pid)

    def stop(
        self,
        *,
        graceful: bool,
        timeout_s: float,
        settled: Callable[[], bool] | None = None,
    ) -> None:
        """End it and every process of its group; safe to call more than once.

        Graceful: SIGINT to tritonserver first (its stubs are told to finish by tritonserver
        itself), so it finishes its requests and unloads its models, until it exits, ``timeout_s``
        passes or ``settled()`` says nothing left is worth waiting for; SIGKILL then makes sure
        neither it nor a python-backend stub outlives the call.
        """
        if self._log_file.closed:
            return
        group = self.pid
        leftovers: list[int] = []
        try:
            # Until it is reaped, signalling it or its group cannot hit a stranger (see exit_code).
            if graceful and self.exit_code() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGINT)
                self._wait_for_exit(timeout_s, settled)
            if self._process.returncode is None or live_group_members(group):
                # tritonserver past its time, or stubs an exited tritonserver left behind
                signal_group(group, signal.SIGKILL)
            try:
                self._process.wait(timeout=GROUP_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ServerError(
                    f"tritonserver (pid {group}) did not exit {GROUP_EXIT_TIMEOUT_S:g} s after"
                    " SIGKILL; it may be stuck in the kernel (check `ps -o pid,stat,wchan -p"
                    f" {group}`)"
                ) from None
            leftovers = wait_for_group_exit(group, GROUP_EXIT_TIMEOUT_S)
            if not leftovers and self.shm_prefix:
                # A killed server cannot remove the shared memory it gave its stubs; with no
                # process of its group left, nothing uses regions under its prefix any more.
                for region in _SHARED_MEMORY_DIR.glob(f"{self.shm_prefix}*"):
                    _remove_quietly(region)
        finally:
            self._log_file.close()
            if self._keeper is not None and self._process.returncode is not None:
                self._keeper.close()  # its thread forked the server, which is gone now
                self._keeper = None
        if leftovers:
            raise ServerError(
                f"processes {leftovers} of tritonserver's process group {group} still run "
                f"{GROUP_EXIT_TIMEOUT_S:g} s after SIGKILL; kill them with `kill -9 -{group}`"
            )

    def _wait_for_exit(self, timeout_s: float, settled: Callable[[], bool] | None) -> None:
        deadline = time.monotonic() + timeout_s
        while self.exit_code() is None and time.monotonic() < deadline:
            if settled is not None and settled():
                return
            time.sleep(_EXIT_POLL_S)


def new_shm_prefix() -> str:
    """A prefix for one server's python-backend shared memory, so it can be found and removed."""
    return f"merlin_torch_serving_{os.getpid()}_{secrets.token_hex(4)}_"


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that are free right now on all interfaces, as tritonserver binds."""
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(probe)
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
