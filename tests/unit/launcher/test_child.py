"""The child process and its log, on small shell scripts standing in for tritonserver (the real one
is started by tests/integration/test_server.py)."""

from __future__ import annotations

import gc
import os
import signal
import time
from pathlib import Path

import pytest

from merlin_torch_serving.exceptions import ServerError
from merlin_torch_serving.launcher.child import ServerLog, ServerProcess, free_ports, new_shm_prefix
from merlin_torch_serving.launcher.process import live_group_members, process_info


def start(script: str, log: ServerLog, shm_prefix: str | None = None) -> ServerProcess:
    return ServerProcess(["/bin/sh", "-c", script], log, dict(os.environ), shm_prefix)


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def is_gone(pid: int) -> bool:
    info = process_info(pid, with_argv=False)
    return info is None or info.state in ("Z", "X")


def test_the_log_holds_stdout_and_stderr_and_reads_from_an_offset(tmp_path):
    log = ServerLog(tmp_path / "server.log")
    process = start("echo out; echo err >&2; exit 3", log)
    wait_for(lambda: process.exit_code() is not None)
    assert process.exit_code() == 3
    assert log.text() == "out\nerr\n"
    assert log.since(4) == "err\n"
    assert log.size() == 8
    process.stop(graceful=True, timeout_s=1.0)


def test_an_exit_is_seen_without_reaping_so_the_pid_stays_taken_until_stop(tmp_path):
    process = start("exit 0", ServerLog(tmp_path / "server.log"))
    wait_for(lambda: process.exit_code() is not None)
    assert (
        process_info(process.pid, with_argv=False).state == "Z"
    )  # still ours: nobody else gets the pid
    process.stop(graceful=True, timeout_s=1.0)
    assert process_info(process.pid, with_argv=False) is None


def test_a_signal_that_ended_the_process_is_its_negative_exit_code(tmp_path):
    process = start("kill -9 $$", ServerLog(tmp_path / "server.log"))
    wait_for(lambda: process.exit_code() is not None)
    assert process.exit_code() == -9
    process.stop(graceful=False, timeout_s=1.0)


@pytest.mark.parametrize("parent_ignores_sigint", [False, True], ids=["default", "ignored"])
def test_a_graceful_stop_sends_sigint_first(tmp_path, parent_ignores_sigint):
    # Ignored: as in a shell's background job, whose SIGINT disposition a child would inherit.
    log = ServerLog(tmp_path / "server.log")
    previous = signal.signal(
        signal.SIGINT, signal.SIG_IGN if parent_ignores_sigint else signal.default_int_handler
    )
    try:
        process = start(
            "trap 'echo interrupted; exit 0' INT; echo ready; while :; do sleep 0.05; done", log
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    wait_for(lambda: "ready" in log.text())
    process.stop(graceful=True, timeout_s=10.0)
    assert log.text() == "ready\ninterrupted\n"
    assert is_gone(process.pid)


def test_stop_kills_the_whole_group_when_sigint_is_ignored(tmp_path):
    log = ServerLog(tmp_path / "server.log")
    # the "stub": a grandchild that ignores SIGINT too and would outlive a stop of its parent alone
    process = start("trap '' INT; sleep 300 & echo $!; wait", log)
    wait_for(lambda: log.text().strip().isdigit())
    grandchild = int(log.text())
    started = time.monotonic()
    process.stop(graceful=True, timeout_s=0.3)
    assert time.monotonic() - started < 5.0
    assert is_gone(process.pid)
    assert is_gone(grandchild)
    process.stop(graceful=True, timeout_s=0.3)  # a second stop does nothing


def test_sigint_goes_to_the_server_alone_and_its_stubs_hear_of_the_stop_from_it(tmp_path):
    log = ServerLog(tmp_path / "server.log")
    # the "stub" would write down a SIGINT; tritonserver tells its stubs to finish itself
    process = start(
        "trap 'exit 0' INT; sh -c \"trap 'echo stub-interrupted' INT; sleep 300\" & echo ready;"
        " wait",
        log,
    )
    wait_for(lambda: "ready" in log.text())
    process.stop(graceful=True, timeout_s=10.0)
    assert log.text() == "ready\n"
    assert live_group_members(process.pid) == []


def test_a_graceful_stop_ends_at_once_when_nothing_left_is_worth_waiting_for(tmp_path):
    log = ServerLog(tmp_path / "server.log")
    # a server that would never finish stopping (one waiting for a model version it never frees)
    process = start("trap 'echo stopping' INT; echo ready; while :; do sleep 0.05; done", log)
    wait_for(lambda: "ready" in log.text())
    started = time.monotonic()
    process.stop(graceful=True, timeout_s=60.0, settled=lambda: "stopping" in log.text())
    assert time.monotonic() - started < 30.0  # not the 60 s: a bound a loaded machine keeps
    assert log.text() == "ready\nstopping\n"
    assert is_gone(process.pid)


def test_stop_removes_the_shared_memory_under_the_servers_prefix_only(tmp_path):
    prefix = new_shm_prefix()
    ours, theirs = Path(f"/dev/shm/{prefix}region"), Path(f"/dev/shm/other_{prefix}region")
    ours.write_bytes(b"x")
    theirs.write_bytes(b"x")
    try:
        process = start("exit 0", ServerLog(tmp_path / "server.log"), shm_prefix=prefix)
        process.stop(graceful=False, timeout_s=1.0)
        assert not ours.exists()
        assert theirs.exists()
    finally:
        for path in (ours, theirs):
            path.unlink(missing_ok=True)


def test_a_binary_that_cannot_run_is_a_server_error_naming_it(tmp_path):
    with pytest.raises(
        ServerError, match=r"could not run '/nonexistent/tritonserver': .*No such file"
    ):
        ServerProcess(
            ["/nonexistent/tritonserver"], ServerLog(tmp_path / "server.log"), dict(os.environ)
        )


def test_a_log_path_that_cannot_be_written_asks_for_a_writable_one(tmp_path):
    with pytest.raises(
        ServerError, match=r"could not open the server log .*; pass a writable log_path"
    ):
        ServerLog(tmp_path / "missing" / "server.log").open_for_writing()


def test_a_temporary_log_is_removed_with_its_owner_and_reads_as_empty_before_the_start():
    log = ServerLog()
    assert (log.text(), log.size()) == ("", 0)
    log.open_for_writing().close()
    path = log.path
    assert path is not None
    assert path.exists()
    del log
    gc.collect()
    assert not path.exists()


def test_free_ports_are_distinct():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert all(0 < port < 65536 for port in ports)
