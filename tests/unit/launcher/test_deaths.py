"""Telling a stub that died from one tritonserver ended itself, on real child processes standing
in for stubs: a process killed and left uncollected died; one its parent collects at once (as
tritonserver collects the stubs it retires, however they end) did not."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

from merlin_torch_serving.launcher import deaths


def killed_child(collect: bool) -> subprocess.Popen:
    child = subprocess.Popen(["sleep", "60"])
    if collect:  # its parent waits for it, as tritonserver waits for a stub it ends
        threading.Thread(target=child.wait, daemon=True).start()
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    return child


def test_a_killed_stub_nobody_collects_died():
    child = killed_child(collect=False)
    try:
        time.sleep(0.1)  # a zombie now
        assert deaths._died(child.pid, grace_s=0.1)
    finally:
        child.wait()


def test_a_killed_stub_its_parent_collects_at_once_was_retired():
    child = killed_child(collect=True)
    assert not deaths._died(child.pid, grace_s=0.5)


def test_a_stub_that_exits_with_code_0_was_retired():
    child = subprocess.Popen(["true"])
    try:
        time.sleep(0.2)
        assert not deaths._died(child.pid, grace_s=0.1)
    finally:
        child.wait()
