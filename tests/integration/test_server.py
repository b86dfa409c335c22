"""TritonServer against the real tritonserver: serving, explicit model control, every start error,
cleanup.

Error cases and the "none" mode start short-lived servers of their own; the rest share one server.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from merlin_torch_serving.exceptions import (
    BackendNotAvailableError,
    ModelLoadError,
    PortInUseError,
    ServerError,
    ServerExitedError,
    ServerNotFoundError,
    ServerStartTimeoutError,
)
from merlin_torch_serving.launcher.server import ModelStatus, TritonServer
from tests.triton_models import write_doubler, write_invalid_config, write_onnx_model

pytestmark = pytest.mark.integration

PROCESS_EXIT_TIMEOUT_S = 15.0


def status_of(server: TritonServer, name: str) -> ModelStatus:
    return next(model for model in server.models() if model.name == name)


# -- processes, read from /proc ----------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def is_alive(pid: int) -> bool:
    """True while ``pid`` is a process that is not a zombie (a zombie holds no resources)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def live_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and is_alive(int(entry))]


def command_line(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def stub_pids(server_pid: int) -> list[int]:
    """The python-backend stubs tritonserver ``server_pid`` runs, one per model instance."""
    return [
        pid
        for pid in live_pids()
        if (_stat_fields(pid) or ["", "0"])[1] == str(server_pid)
        and "triton_python_backend_stub" in command_line(pid)
    ]


def processes_using(repository: Path) -> list[int]:
    """Every live process whose command line names ``repository``: the server and its stubs."""
    return [
        pid for pid in live_pids() if str(repository) in command_line(pid) and pid != os.getpid()
    ]


def wait_until_gone(pids, timeout_s: float = PROCESS_EXIT_TIMEOUT_S) -> list[int]:
    deadline = time.monotonic() + timeout_s
    survivors = [pid for pid in pids if is_alive(pid)]
    while survivors and time.monotonic() < deadline:
        time.sleep(0.1)
        survivors = [pid for pid in survivors if is_alive(pid)]
    return survivors


def wait_until_nothing_uses(
    repository: Path, timeout_s: float = PROCESS_EXIT_TIMEOUT_S
) -> list[int]:
    deadline = time.monotonic() + timeout_s
    survivors = processes_using(repository)
    while survivors and time.monotonic() < deadline:
        time.sleep(0.1)
        survivors = processes_using(repository)
    return survivors


# -- the shared server ---------------------------------------------------------------------------


def test_loaded_python_model_answers_over_http_and_grpc(triton_server):
    write_doubler(triton_server.repository, "doubler")
    triton_server.load("doubler")
    x = np.array([-3, 0, 7, 2**40], dtype=np.int64)
    for client_module, url in (
        (httpclient, triton_server.http_url),
        (grpcclient, triton_server.grpc_url),
    ):
        client = client_module.InferenceServerClient(url)
        try:
            request = client_module.InferInput("x", list(x.shape), "INT64")
            request.set_data_from_numpy(x)
            y = client.infer("doubler", [request]).as_numpy("y")
        finally:
            client.close()
        assert y.dtype == np.int64, client_module.__name__
        np.testing.assert_array_equal(y, x * 2, err_msg=client_module.__name__)


def test_models_reports_version_and_state_through_load_and_unload(triton_server):
    # Two versions under the default version policy (latest 1): only version 2 is served.
    write_doubler(triton_server.repository, "versioned", versions=(1, 2))
    assert status_of(triton_server, "versioned") == ModelStatus("versioned", None, None, "")

    triton_server.load("versioned")
    assert status_of(triton_server, "versioned") == ModelStatus("versioned", 2, "READY", "")

    triton_server.unload("versioned")
    assert status_of(triton_server, "versioned") == ModelStatus(
        "versioned", 2, "UNAVAILABLE", "unloaded"
    )


def test_load_raises_model_load_error_with_the_reason_when_initialize_raises(triton_server):
    write_doubler(
        triton_server.repository,
        "fails_in_initialize",
        initialize="raise ValueError('no weights here')",
    )
    with pytest.raises(
        ModelLoadError, match=r"'fails_in_initialize': .*ValueError: no weights here"
    ) as caught:
        triton_server.load("fails_in_initialize")
    assert not isinstance(caught.value, BackendNotAvailableError)
    assert list(caught.value.failures) == ["fails_in_initialize"]
    assert triton_server.is_running, "one bad model must not take the server down"


def test_load_raises_model_load_error_with_the_parse_error_when_config_is_invalid(triton_server):
    write_invalid_config(triton_server.repository, "invalid_config")
    # The server's answer only says the folder could not be polled; the parse error comes from its
    # log.
    with pytest.raises(
        ModelLoadError, match=r"'invalid_config': .*no field named \"no_such_field\".*config\.pbtxt"
    ) as caught:
        triton_server.load("invalid_config")
    assert list(caught.value.failures) == ["invalid_config"]


def test_load_raises_model_load_error_when_the_model_is_not_in_the_repository(triton_server):
    with pytest.raises(ModelLoadError, match=r"'not_written': .*not found in any model repository"):
        triton_server.load("not_written")


def test_load_raises_backend_not_available_naming_the_missing_and_present_backends(triton_server):
    write_onnx_model(triton_server.repository, "needs_onnx")
    available = triton_server.backends()
    with pytest.raises(
        BackendNotAvailableError,
        match=(
            r"model 'needs_onnx' needs backend 'onnxruntime', which this tritonserver does not"
            r" have "
            rf"\(it has: {re.escape(', '.join(available))}\).*backend_directory="
        ),
    ) as caught:
        triton_server.load("needs_onnx")
    assert caught.value.missing == {"needs_onnx": "onnxruntime"}
    assert caught.value.available == available
    assert {"ensemble", "python"} <= set(available)  # ensembles need no backend library


def test_logs_returns_what_the_server_wrote(triton_server):
    write_doubler(triton_server.repository, "logged")
    triton_server.load("logged")
    port = triton_server.http_url.rsplit(":", 1)[1]
    log = triton_server.logs()
    assert f"Started HTTPService at 127.0.0.1:{port}" in log
    assert "successfully loaded 'logged'" in log


# -- servers of their own: "none" mode and lifetime ----------------------------------------------


def test_none_mode_loads_every_model_at_start_and_stop_leaves_no_process(tmp_path):
    write_doubler(tmp_path, "first")
    write_doubler(tmp_path, "second")
    with TritonServer(tmp_path) as server:
        assert sorted(server.models(), key=lambda model: model.name) == [
            ModelStatus("first", 1, "READY", ""),
            ModelStatus("second", 1, "READY", ""),
        ]
        stubs = stub_pids(server.pid)
        stub_models = sorted(Path(command_line(pid).split()[1]).parent.parent.name for pid in stubs)
        assert stub_models == ["first", "second"]
        with pytest.raises(
            ServerError, match=r"load\(\) needs a server started with model_control='explicit'"
        ):
            server.load("first")
    assert not server.is_running
    assert wait_until_gone([server.pid, *stubs]) == []


def test_no_process_outlives_a_parent_killed_with_sigkill(tmp_path):
    write_doubler(tmp_path / "repository", "served")
    parent_script = textwrap.dedent("""
        import sys, time
        from merlin_torch_serving.launcher.server import TritonServer
        server = TritonServer(sys.argv[1], start_timeout_s=60).start()
        print(server.pid, flush=True)
        time.sleep(600)
        """)
    with subprocess.Popen(
        [sys.executable, "-c", parent_script, str(tmp_path / "repository")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a killed parent cannot remove its server log: let it leave it where pytest cleans up
        env={**os.environ, "TMPDIR": str(tmp_path)},
    ) as parent:
        try:
            ready, _, _ = select.select([parent.stdout], [], [], 90)
            assert ready, "the parent process printed no server pid within 90 s"
            line = parent.stdout.readline().decode().strip()
            assert line.isdigit(), (
                f"the parent did not start a server: {line!r} {parent.stderr.read1().decode()!r}"
            )
            server_pid = int(line)
            stubs = stub_pids(server_pid)
            assert stubs, "the served model should run in a python-backend stub"

            parent.send_signal(signal.SIGKILL)
            parent.wait(timeout=10)

            assert wait_until_gone([server_pid, *stubs]) == []
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait(timeout=10)
            for pid in processes_using(tmp_path / "repository"):
                os.kill(pid, signal.SIGKILL)


def shared_memory_prefix(server_pid: int) -> str:
    """The python backend's shared-memory prefix, as given on the server's command line."""
    match = re.search(r"shm-region-prefix-name=(\S+)", command_line(server_pid))
    assert match, f"no shared-memory prefix on the command line: {command_line(server_pid)!r}"
    return match.group(1)


def test_calls_raise_server_exited_when_the_server_dies_after_start(tmp_path):
    write_doubler(tmp_path, "preloaded")
    write_doubler(tmp_path, "left_alone")
    server = TritonServer(tmp_path, model_control="explicit", load_models=["preloaded"])
    with server:
        assert {model.name: model.state for model in server.models()} == {
            "preloaded": "READY",
            "left_alone": None,
        }
        prefix = shared_memory_prefix(server.pid)
        assert list(Path("/dev/shm").glob(f"{prefix}*")), (
            "the loaded model's stub should share memory with the server"
        )
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + PROCESS_EXIT_TIMEOUT_S
        while server.is_running and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ServerExitedError, match=r"tritonserver exited with code -9"):
            server.models()
        with pytest.raises(ServerExitedError, match=r"tritonserver exited with code -9"):
            server.load("left_alone")
    assert wait_until_nothing_uses(tmp_path) == []
    # A killed server cannot clean up after itself; stop() does it instead.
    assert list(Path("/dev/shm").glob(f"{prefix}*")) == []


# -- start errors -------------------------------------------------------------------------------


def test_start_raises_one_error_naming_every_failing_model_and_the_missing_backend(tmp_path):
    """How each failure is read from the log is tested on recorded logs (tests/unit/launcher); this
    start shows the whole path, and that a failed start leaves no process."""
    write_doubler(tmp_path, "good")
    write_doubler(
        tmp_path, "fails_in_initialize", initialize="raise RuntimeError('checkpoint missing')"
    )
    write_invalid_config(tmp_path, "invalid_config")
    write_onnx_model(tmp_path, "needs_onnx")
    server = TritonServer(tmp_path)
    with pytest.raises(
        BackendNotAvailableError,
        match=(
            r"model 'needs_onnx' needs backend 'onnxruntime'.*\(it has: ensemble, python.*NGC image"
        ),
    ) as caught:
        server.start()
    error = caught.value
    assert error.missing == {"needs_onnx": "onnxruntime"}
    assert sorted(error.failures) == ["fails_in_initialize", "invalid_config", "needs_onnx"]
    assert "RuntimeError: checkpoint missing" in error.failures["fails_in_initialize"]
    assert 'no field named "no_such_field"' in error.failures["invalid_config"]
    assert (
        "unable to find backend library for backend 'onnxruntime'" in error.failures["needs_onnx"]
    )
    assert "Models that failed:\n  'fails_in_initialize': " in str(error)
    assert not server.is_running
    assert wait_until_nothing_uses(tmp_path) == []


def test_start_raises_timeout_and_stops_the_server_when_a_model_loads_too_slowly(tmp_path):
    write_doubler(tmp_path, "slow", initialize="time.sleep(120)")
    server = TritonServer(tmp_path, start_timeout_s=4.0)
    with pytest.raises(
        ServerStartTimeoutError,
        match=r"not ready after 4 s \(still waiting for model\(s\) 'slow' to finish loading",
    ):
        server.start()
    assert not server.is_running
    assert wait_until_nothing_uses(tmp_path) == []


def test_start_raises_port_in_use_naming_the_port_when_a_requested_port_is_taken(tmp_path):
    """One protocol here; the log lines of all three are read in tests/unit/launcher."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = TritonServer(tmp_path, model_control="explicit", grpc_port=port)
        with pytest.raises(
            PortInUseError, match=rf"the gRPC port {port} is already in use"
        ) as caught:
            server.start()
    assert caught.value.port == port
    assert server.pid is None  # found before tritonserver was started


def test_start_raises_server_exited_with_the_log_when_tritonserver_rejects_an_argument(tmp_path):
    server = TritonServer(tmp_path, extra_args=["--no-such-option"])
    with pytest.raises(
        ServerExitedError, match=r"(?s)exited with code 1\b.*unrecognized option '--no-such-option'"
    ):
        server.start()


def test_start_raises_server_not_found_when_the_binary_does_not_exist(tmp_path):
    missing = tmp_path / "bin" / "tritonserver"
    with pytest.raises(
        ServerNotFoundError, match=re.escape(f"binary={str(missing)!r} (does not exist)")
    ):
        TritonServer(tmp_path, binary=missing).start()


def test_start_raises_server_not_found_when_the_binary_is_not_executable(tmp_path):
    not_executable = tmp_path / "tritonserver"
    not_executable.write_text("#!/bin/sh\n")
    with pytest.raises(
        ServerNotFoundError, match=re.escape(f"binary={str(not_executable)!r} (not executable)")
    ):
        TritonServer(tmp_path, binary=not_executable).start()


def test_start_raises_server_not_found_when_the_env_var_points_nowhere(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "tritonserver"
    monkeypatch.setenv("MTS_TRITONSERVER", str(missing))
    with pytest.raises(
        ServerNotFoundError, match=re.escape(f"MTS_TRITONSERVER={str(missing)!r} (does not exist)")
    ):
        TritonServer(tmp_path).start()
