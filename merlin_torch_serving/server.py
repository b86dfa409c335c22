"""Launch and supervise a local tritonserver on a model repository, and turn what it logs into errors.

By default it runs the tritonserver bundled with nvidia-pytriton, with the backend folder that
``backends.layout`` lays out for this interpreter (the python backend, and the pytorch one once built).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import http.client
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from merlin_torch_serving.backends.bundle import pytriton_libraries, pytriton_server_root
from merlin_torch_serving.backends.layout import bundled_backend_directory, python_backend_directory
from merlin_torch_serving.exceptions import (
    BackendNotAvailableError,
    ModelLoadError,
    PortInUseError,
    ServerError,
    ServerExitedError,
    ServerNotFoundError,
    ServerStartTimeoutError,
)
from merlin_torch_serving.locations import repository_argument, server_repository

__all__ = ["BINARY_ENV_VAR", "ModelStatus", "TritonServer", "find_tritonserver", "python_backend_directory"]

BINARY_ENV_VAR = "MTS_TRITONSERVER"
MODEL_CONTROL_MODES = ("none", "explicit")

_PORT_ATTEMPTS = 3
_POLL_INTERVAL_S = 0.1
_REQUEST_TIMEOUT_S = 10.0
_GROUP_EXIT_TIMEOUT_S = 5.0
_LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_SHARED_MEMORY_DIR = Path("/dev/shm")
_SHM_PREFIX_OPTION = "shm-region-prefix-name"

# Printed by every start on a machine without a GPU; the server runs fine, so errors leave them out.
_CPU_MACHINE_NOISE = (
    "NVML",
    "DCGM",
    "CudaDriverHelper",
    "CUDA driver version is insufficient",
    "CUDA memory pool",
)
_PORT_IN_USE = re.compile(r"failed to start (\w+) service: .*?Socket '[^']*:(\d+)' already in use")
_PROTOCOL_NAMES = {"HTTP": "HTTP", "GRPC": "gRPC", "METRICS": "metrics"}
_MISSING_BACKEND = re.compile(r"unable to find backend library for backend '([^']+)'")
# how an ensemble's load error quotes the error of a step it depends on
_DEPENDENCY_FAILURE = re.compile(r"Model '([^']+)' loading failed with error: (.+?)(?=;\s*Model '|;?\s*$)")
_TRITON_LOG_LINE = re.compile(r'^[IWE]\d{4} \S+ +\d+ \S+\] "?(.*?)"?$')
_PROTOBUF_ERROR_LINE = re.compile(r"^\[libprotobuf ERROR [^\]]*\] (.*)$")


@dataclasses.dataclass(frozen=True)
class ModelStatus:
    """One row of the server's repository index."""

    name: str
    #: None when the server has never tried to load the model
    version: int | None
    #: "READY", "LOADING", "UNLOADING" or "UNAVAILABLE"; None when never loaded
    state: str | None
    #: why the model is UNAVAILABLE, in the server's words ("unloaded" after unload)
    reason: str = ""


def find_tritonserver(binary: str | os.PathLike | None = None) -> Path:
    """The tritonserver to run: ``binary``, else $MTS_TRITONSERVER, else PATH, else nvidia-pytriton's.

    An explicit choice that does not exist is an error rather than a reason to fall back, so a
    typo never silently runs another server.
    """
    if binary is not None:
        return _checked_binary(Path(binary), f"binary={os.fspath(binary)!r}")
    from_env = os.environ.get(BINARY_ENV_VAR)
    if from_env:
        return _checked_binary(Path(from_env), f"{BINARY_ENV_VAR}={from_env!r}")
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path)
    searched = ["`tritonserver` on PATH (not found)"]
    bundle = pytriton_server_root()
    if bundle is None:
        searched.append("the nvidia-pytriton package (not installed)")
    else:
        bundled = bundle / "bin" / "tritonserver"
        if _is_executable(bundled):
            return bundled
        searched.append(f"{str(bundled)!r} (missing or not executable)")
    raise ServerNotFoundError(searched)


class TritonServer:
    """A tritonserver process on ``repository``; use as a context manager or call start()/stop().

    ``repository`` is a local folder or a URL tritonserver reads itself (``s3://``, ``gs://``,
    ``as://``; credentials come from the usual environment variables, which the server inherits).

    The process runs in its own process group and is killed when the thread that started it
    dies (Linux's parent-death signal follows the starting thread), so start it from a thread
    that lives as long as the server.
    """

    def __init__(
        self,
        repository: str | os.PathLike,
        *,
        binary: str | os.PathLike | None = None,
        backend_directory: str | os.PathLike | None = None,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        model_control: str = "none",
        load_models: Sequence[str] = (),
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 20.0,
        log_verbose: int = 0,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike | None = None,
    ):
        if model_control not in MODEL_CONTROL_MODES:
            raise ValueError(
                f"model_control must be one of {MODEL_CONTROL_MODES}, got {model_control!r}"
            )
        if isinstance(load_models, str):
            raise TypeError(f"load_models must be a sequence of model names, got the string {load_models!r}")
        if load_models and model_control != "explicit":
            raise ValueError(
                f"load_models={list(load_models)!r} needs model_control='explicit'; with "
                f"model_control={model_control!r} the server loads every model in the repository"
            )
        for name, value in (("start_timeout_s", start_timeout_s), ("stop_timeout_s", stop_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        #: a local Path, or the object-store URL as given
        self.repository = server_repository(repository)
        self._binary = binary
        self._backend_directory = Path(backend_directory) if backend_directory is not None else None
        self._requested_ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self._ports: dict[str, int] = {}
        self._model_control = model_control
        self._load_models = list(load_models)
        self._start_timeout_s = float(start_timeout_s)
        self._stop_timeout_s = float(stop_timeout_s)
        self._log_verbose = int(log_verbose)
        self._extra_args = [str(arg) for arg in extra_args]
        self._log_path = Path(log_path) if log_path is not None else None
        self._log_file = None
        self._resolved_backend_directory: Path | None = None
        self._process: subprocess.Popen | None = None
        self._pid: int | None = None
        self._shm_prefix: str | None = None

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> TritonServer:
        """Start the server and return once it serves; on any failure it is stopped, then raised."""
        if self._process is not None:
            raise ServerError(
                f"this TritonServer already runs (pid {self._pid}); call stop() before starting it again"
            )
        if isinstance(self.repository, Path) and not self.repository.is_dir():
            raise ServerError(
                f"model repository {str(self.repository)!r} is not a directory; create it or pass "
                "the folder that holds the model folders"
            )
        binary = find_tritonserver(self._binary)
        backend_directory = self._resolve_backend_directory(binary)
        self._resolved_backend_directory = backend_directory
        deadline = time.monotonic() + self._start_timeout_s
        attempts_left = _PORT_ATTEMPTS
        while True:
            picked = self._choose_ports()
            self._launch(binary, backend_directory)
            try:
                self._wait_until_ready(deadline)
                return self
            except PortInUseError as error:
                self._shut_down(graceful=False)
                attempts_left -= 1
                # A port the OS gave us may be taken between our probe and the server's bind.
                if error.port not in picked or attempts_left == 0:
                    raise
            except BaseException:
                # Nothing is in flight yet, so there is nothing to wait for.
                self._shut_down(graceful=False)
                raise

    def stop(self) -> None:
        """Stop the server and every process of its group; safe to call more than once.

        SIGINT lets tritonserver finish its requests and unload its models; SIGKILL after
        stop_timeout_s makes sure neither it nor a python-backend stub outlives the call.
        """
        self._shut_down(graceful=True)

    def _shut_down(self, *, graceful: bool) -> None:
        process = self._process
        if process is None:
            return
        group = process.pid
        leftovers: list[int] = []
        try:
            # Until it is reaped, the server's pid (its group id) cannot be reused by another
            # process, so signalling the group cannot hit a stranger.
            if graceful and self._exit_code() is None:
                _signal_group(group, signal.SIGINT)
                self._wait_for_exit(self._stop_timeout_s)
            if process.returncode is None:
                _signal_group(group, signal.SIGKILL)
            try:
                process.wait(timeout=_GROUP_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ServerError(
                    f"tritonserver (pid {group}) did not exit {_GROUP_EXIT_TIMEOUT_S:g} s after SIGKILL; "
                    "it may be stuck in the kernel (check `ps -o pid,stat,wchan -p "
                    f"{group}`)"
                ) from None
            leftovers = _wait_for_group_exit(group, _GROUP_EXIT_TIMEOUT_S)
            if not leftovers and self._shm_prefix:
                # A killed server cannot remove the shared memory it gave its stubs; with no
                # process of its group left, nothing uses regions under its prefix any more.
                _remove_shared_memory(self._shm_prefix)
        finally:
            self._process = None
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        if leftovers:
            raise ServerError(
                f"processes {leftovers} of tritonserver's process group {group} still run "
                f"{_GROUP_EXIT_TIMEOUT_S:g} s after SIGKILL; kill them with `kill -9 -{group}`"
            )

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- what it is ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The pid of the last started tritonserver; kept after stop() so callers can check it is gone."""
        return self._pid

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._exit_code() is None

    @property
    def http_url(self) -> str:
        """``127.0.0.1:<port>``, the form tritonclient.http takes."""
        return f"127.0.0.1:{self._port('http')}"

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:<port>``, the form tritonclient.grpc takes."""
        return f"127.0.0.1:{self._port('grpc')}"

    @property
    def metrics_url(self) -> str:
        """``127.0.0.1:<port>``; the Prometheus metrics are at ``http://<metrics_url>/metrics``."""
        return f"127.0.0.1:{self._port('metrics')}"

    def logs(self) -> str:
        """Everything the server wrote to stdout and stderr since the last start."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(encoding="utf-8", errors="replace")

    def backends(self) -> list[str]:
        """Backends this server can run: the subfolders of its backend directory, plus "ensemble"."""
        directory = self._resolved_backend_directory or self._resolve_backend_directory(
            find_tritonserver(self._binary)
        )
        found = [entry.name for entry in directory.iterdir() if entry.is_dir()] if directory.is_dir() else []
        # Ensembles are scheduled by the server core, not by a backend library.
        return sorted({*found, "ensemble"})

    def models(self) -> list[ModelStatus]:
        """The repository index: every model folder, with the state of each version the server knows."""
        self._require_running()
        try:
            status, body = self._request("POST", "/v2/repository/index", _REQUEST_TIMEOUT_S)
        except TimeoutError:
            raise ServerError(
                f"tritonserver at {self.http_url} did not answer the repository index request within "
                f"{_REQUEST_TIMEOUT_S:g} s",
                self._log_tail(),
            ) from None
        if status != 200:
            raise ServerError(
                f"tritonserver refused the repository index request (HTTP {status}): {_error_text(body)}",
                self._log_tail(),
            )
        return [
            ModelStatus(
                name=entry["name"],
                version=int(entry["version"]) if entry.get("version") else None,
                state=entry.get("state") or None,
                reason=(entry.get("reason") or "").strip(),
            )
            for entry in json.loads(body)
        ]

    # -- explicit model control ---------------------------------------------------------------

    def load(self, name: str, timeout_s: float = 120.0) -> None:
        """Load (or reload) model ``name`` from the repository; needs model_control="explicit"."""
        self._require_explicit("load")
        self._require_running()
        try:
            reason = self._load(name, timeout_s)
        except TimeoutError:
            raise ModelLoadError(
                {
                    name: f"still loading after timeout_s={timeout_s:g} s (the server keeps loading it "
                    "in the background); pass a larger timeout_s if the model is slow to initialize"
                },
                self._log_tail(),
            ) from None
        if reason is not None:
            raise self._load_error({name: reason})

    def unload(self, name: str, timeout_s: float = 30.0) -> None:
        """Unload model ``name`` and wait until the server has released it; needs model_control="explicit"."""
        self._require_explicit("unload")
        self._require_running()
        deadline = time.monotonic() + timeout_s
        try:
            status, body = self._request("POST", f"/v2/repository/models/{_quote(name)}/unload", timeout_s)
        except TimeoutError:
            status, body = None, ""
        if status is not None and status != 200:
            raise ServerError(
                f"tritonserver refused to unload model {name!r} (HTTP {status}): {_error_text(body)}",
                self._log_tail(),
            )
        while True:
            state = next((model.state for model in self.models() if model.name == name), None)
            if state not in ("READY", "UNLOADING"):
                return
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"model {name!r} is still {state} {timeout_s:g} s after its unload was asked for; "
                    "a model whose finalize() hangs keeps it there (see the log), or pass a larger timeout_s",
                    self._log_tail(),
                )
            time.sleep(_POLL_INTERVAL_S)

    # -- starting -----------------------------------------------------------------------------

    def _resolve_backend_directory(self, binary: Path) -> Path:
        if self._backend_directory is not None:
            return self._backend_directory
        bundle = pytriton_server_root()
        if bundle is not None and _is_within(binary, bundle):
            return bundled_backend_directory(binary)
        # Any other install keeps its backends beside bin/ (e.g. /opt/tritonserver/backends),
        # and its own python backend must not be swapped for the bundle's.
        return binary.resolve().parent.parent / "backends"

    def _choose_ports(self) -> set[int]:
        """Fill the ports left unset with ones the OS assigns; return those it assigned."""
        unset = [key for key, port in self._requested_ports.items() if port is None]
        assigned = dict(zip(unset, _free_ports(len(unset))))
        self._ports = {key: port if port is not None else assigned[key] for key, port in self._requested_ports.items()}
        return set(assigned.values())

    def _launch(self, binary: Path, backend_directory: Path) -> None:
        if self._log_path is None:
            descriptor, path = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(descriptor)
            self._log_path = Path(path)
            weakref.finalize(self, _remove_quietly, self._log_path)
        command = [
            str(binary),
            f"--model-repository={repository_argument(self.repository)}",
            f"--backend-directory={backend_directory}",
            f"--http-port={self._ports['http']}",
            f"--grpc-port={self._ports['grpc']}",
            f"--metrics-port={self._ports['metrics']}",
            f"--model-control-mode={self._model_control}",
            # One bad model must not take the others down; readiness is judged here instead.
            "--exit-on-error=false",
            # Let the server finish its own shutdown before stop() resorts to SIGKILL.
            f"--exit-timeout-secs={max(1, math.floor(self._stop_timeout_s * 0.75))}",
            f"--log-verbose={self._log_verbose}",
            *self._shared_memory_args(),
            *self._extra_args,
        ]
        try:
            self._log_file = open(self._log_path, "wb")  # noqa: SIM115 -- closed by stop()
        except OSError as error:
            raise ServerError(
                f"could not open the server log {str(self._log_path)!r}: {error}; pass a writable log_path"
            ) from error
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=_server_environment(),
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        except (OSError, subprocess.SubprocessError) as error:
            self._log_file.close()
            self._log_file = None
            raise ServerError(f"could not run {str(binary)!r}: {error}") from error
        self._pid = self._process.pid

    def _shared_memory_args(self) -> list[str]:
        """Give this server's python-backend shared memory a prefix of its own, so stop() can find it."""
        if any(_SHM_PREFIX_OPTION in arg for arg in self._extra_args):
            self._shm_prefix = None  # the caller names the regions and owns them
            return []
        self._shm_prefix = f"merlin_torch_serving_{os.getpid()}_{secrets.token_hex(4)}_"
        return [f"--backend-config=python,{_SHM_PREFIX_OPTION}={self._shm_prefix}"]

    def _wait_until_ready(self, deadline: float) -> None:
        ports = set(self._ports.values())
        while True:
            self._raise_if_exited()
            # Listening sockets owned by our pid prove the ports are ours: the server logs
            # "Started ..." before it binds, and a stranger on the port could answer /health.
            if ports <= _ports_listened_by(self._pid) and self._is_live():
                break
            if time.monotonic() >= deadline:
                raise ServerStartTimeoutError(
                    self._start_timeout_s, self._what_start_waits_for(ports), self._log_tail()
                )
            time.sleep(_POLL_INTERVAL_S)
        if self._model_control == "none":
            failures = {
                model.name: model.reason or self._reason_from_log(model.name)
                for model in self._settled_models(deadline)
                if model.state != "READY"
            }
        else:
            failures = {}
            for name in self._load_models:
                try:
                    reason = self._load(name, max(0.001, deadline - time.monotonic()))
                except TimeoutError:
                    raise ServerStartTimeoutError(
                        self._start_timeout_s, f"model {name!r} to load", self._log_tail()
                    ) from None
                if reason is not None:
                    failures[name] = reason
        if failures:
            raise self._load_error(failures)

    def _settled_models(self, deadline: float) -> list[ModelStatus]:
        while True:
            models = self.models()
            busy = [model.name for model in models if model.state in ("LOADING", "UNLOADING")]
            if not busy:
                return models
            if time.monotonic() >= deadline:
                raise ServerStartTimeoutError(
                    self._start_timeout_s, f"model(s) {_names(busy)} to finish loading", self._log_tail()
                )
            time.sleep(_POLL_INTERVAL_S)

    def _what_start_waits_for(self, ports: set[int]) -> str:
        log = self.logs()
        started = re.findall(r'"loading: (.+?):\d+"', log)
        finished = set(re.findall(r"(?:successfully loaded|failed to load) '([^']+)'", log))
        loading = [name for name in dict.fromkeys(started) if name not in finished]
        if loading:
            return f"model(s) {_names(loading)} to finish loading; the endpoints open only after that"
        missing = sorted(ports - _ports_listened_by(self._pid))
        if missing:
            return f"tritonserver to listen on port(s) {', '.join(map(str, missing))}"
        return f"GET /v2/health/live on {self.http_url} to answer 200"

    # -- talking to the server ------------------------------------------------------------------

    def _load(self, name: str, timeout_s: float) -> str | None:
        """Ask the server to load ``name``; the failure reason, or None once it is loaded."""
        log_offset = self._log_size()
        status, body = self._request("POST", f"/v2/repository/models/{_quote(name)}/load", timeout_s)
        if status == 200:
            return None
        reason = _error_text(body)
        if "failed to poll" in reason:
            # The answer only says the folder could not be read; the log says why.
            details = self._reason_from_log(name, log_offset)
            if details:
                reason = f"{reason}: {details}"
        return reason

    def _request(self, method: str, path: str, timeout_s: float) -> tuple[int, str]:
        """One HTTP call to the server; a timeout surfaces as TimeoutError for the caller to word."""
        connection = http.client.HTTPConnection("127.0.0.1", self._ports["http"], timeout=timeout_s)
        try:
            connection.request(method, path, body=b"" if method == "POST" else None)
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", errors="replace")
        except (ConnectionError, http.client.HTTPException) as error:
            self._raise_if_exited()
            raise ServerError(
                f"tritonserver at {self.http_url} did not answer {method} {path}: {error}", self._log_tail()
            ) from error
        finally:
            connection.close()

    def _is_live(self) -> bool:
        try:
            status, _ = self._request("GET", "/v2/health/live", 1.0)
        except (ServerError, OSError):
            return False
        return status == 200

    # -- supervision ----------------------------------------------------------------------------

    def _port(self, key: str) -> int:
        if key not in self._ports:
            raise ServerError(f"the {key} port is chosen when the server starts; call start() first")
        return self._ports[key]

    def _exit_code(self) -> int | None:
        """The server's exit code if it has ended, without reaping it (see stop())."""
        process = self._process
        if process is None or process.returncode is not None:
            return None if process is None else process.returncode
        try:
            info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return process.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def _wait_for_exit(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def _require_running(self) -> None:
        if self._process is None:
            raise ServerError(
                "tritonserver is not running; call start() or use the TritonServer in a `with` block first"
            )
        self._raise_if_exited()

    def _require_explicit(self, action: str) -> None:
        if self._model_control != "explicit":
            raise ServerError(
                f"{action}() needs a server started with model_control='explicit'; this one runs with "
                f"model_control={self._model_control!r}, which loads every model of the repository at start"
            )

    def _raise_if_exited(self) -> None:
        code = self._exit_code()
        if code is None:
            return
        in_use = _PORT_IN_USE.search(self.logs())
        if in_use:
            protocol = _PROTOCOL_NAMES.get(in_use.group(1).upper(), in_use.group(1))
            raise PortInUseError(int(in_use.group(2)), protocol, self._log_tail())
        raise ServerExitedError(code, self._log_tail())

    def _load_error(self, failures: Mapping[str, str]) -> ModelLoadError:
        failures = _with_dependency_failures(failures)
        missing = {}
        for name, reason in failures.items():
            match = _MISSING_BACKEND.search(reason)
            # an ensemble fails because a step failed; the step is the one missing the backend
            if match and not _DEPENDENCY_FAILURE.search(reason):
                missing[name] = match.group(1)
        if missing:
            return BackendNotAvailableError(failures, missing, self.backends(), self._log_tail())
        return ModelLoadError(failures, self._log_tail())

    # -- the log --------------------------------------------------------------------------------

    def _log_size(self) -> int:
        try:
            return self._log_path.stat().st_size if self._log_path is not None else 0
        except OSError:
            return 0

    def _log_tail(self) -> str:
        lines = [
            line
            for line in self.logs().splitlines()
            if line.strip() and not any(noise in line for noise in _CPU_MACHINE_NOISE)
        ]
        # A rejected argument is followed by a few hundred lines of usage that would push the
        # one line that matters out of the tail.
        usage = next((index for index, line in enumerate(lines) if line.startswith("Usage: tritonserver")), None)
        if usage is not None:
            lines = lines[:usage] + ["(usage text left out; run `tritonserver --help`)"]
        return "\n".join(lines[-_LOG_TAIL_LINES:])

    def _reason_from_log(self, name: str, since_byte: int = 0) -> str:
        """The server's error lines about model ``name``, for failures its API words vaguely."""
        if self._log_path is None:
            return ""
        with open(self._log_path, "rb") as log:
            log.seek(since_byte)
            lines = log.read().decode("utf-8", errors="replace").splitlines()
        quoted = f"'{name}'"
        messages = []
        for index, line in enumerate(lines):
            if quoted not in line or not re.match(r"E\d{4} ", line):
                continue
            # An unreadable config.pbtxt is explained by protobuf on the line before.
            if index > 0 and _PROTOBUF_ERROR_LINE.match(lines[index - 1]):
                messages.append(_PROTOBUF_ERROR_LINE.match(lines[index - 1]).group(1))
            match = _TRITON_LOG_LINE.match(line)
            messages.append(match.group(1) if match else line)
        return "; ".join(dict.fromkeys(messages)) or "not loaded; tritonserver logged no reason (see the log below)"


# -- helpers without state ------------------------------------------------------------------------


def _with_dependency_failures(failures: Mapping[str, str]) -> dict[str, str]:
    """The failures plus, for ensembles, each failed dependency under its own name."""
    expanded = dict(failures)
    for reason in failures.values():
        for name, dependency_reason in _DEPENDENCY_FAILURE.findall(reason):
            expanded.setdefault(name, dependency_reason)
    return expanded


def _checked_binary(path: Path, source: str) -> Path:
    if _is_executable(path):
        return path
    why = "not executable" if path.exists() else "does not exist"
    raise ServerNotFoundError([f"{source} ({why})"])


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _is_within(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _server_environment() -> dict[str, str]:
    environment = dict(os.environ)
    # The python-backend stub embeds CPython but ignores PYTHONPATH: it takes its prefix from the
    # first python3 on PATH, so this interpreter goes first and models import what we import.
    environment["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environment.get("PATH", os.defpath)])
    # The copied backend's RPATH ($ORIGIN/...) no longer reaches the wheel's libraries, and the
    # stub links against this interpreter's libpython.
    libraries = []
    bundled_libraries = pytriton_libraries()
    if bundled_libraries is not None:
        libraries.append(str(bundled_libraries))
    if sysconfig.get_config_var("LIBDIR"):
        libraries.append(sysconfig.get_config_var("LIBDIR"))
    if environment.get("LD_LIBRARY_PATH"):
        libraries.append(environment["LD_LIBRARY_PATH"])
    environment["LD_LIBRARY_PATH"] = os.pathsep.join(libraries)
    return environment


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A preexec_fn that makes the child receive SIGKILL when its parent dies (Linux)."""
    libc = _libc()  # loaded before fork: the child should do as little as possible

    def set_parent_death_signal() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        # The parent may have died between fork and prctl; the signal would then never come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return set_parent_death_signal


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass


def _wait_for_group_exit(group: int, timeout_s: float) -> list[int]:
    """Wait until no live process is left in ``group``; return those still alive at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        members = _live_group_members(group)
        if not members or time.monotonic() >= deadline:
            return members
        time.sleep(0.05)


def _live_group_members(group: int) -> list[int]:
    """Pids in process group ``group`` that are not zombies (zombies hold no resources)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces; fixed fields follow it.
        state, _parent, process_group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(process_group) == group and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def _ports_listened_by(pid: int | None) -> set[int]:
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
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local_address is HEXADDR:HEXPORT, state 0A is LISTEN, the inode is the 10th field
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in socket_inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _remove_shared_memory(prefix: str) -> None:
    for region in _SHARED_MEMORY_DIR.glob(f"{prefix}*"):
        _remove_quietly(region)


def _free_ports(count: int) -> list[int]:
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


def _error_text(body: str) -> str:
    try:
        return str(json.loads(body)["error"]).strip().rstrip(";").strip()
    except (ValueError, KeyError, TypeError):
        return body.strip() or "(empty answer)"


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _names(names: Sequence[str]) -> str:
    return ", ".join(repr(name) for name in names)


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
