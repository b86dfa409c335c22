"""Launch and supervise a local tritonserver on a model repository, and turn what it logs into errors.

By default it runs the tritonserver bundled with nvidia-pytriton, with the backend folder that
``backends.layout`` lays out for this interpreter (the python backend, and the pytorch one once built).
The process itself is handled by ``process``, model health and self-repair by ``supervision`` and
``health``.
"""

from __future__ import annotations

import http.client
import json
import math
import os
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
from collections.abc import Mapping, Sequence
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
from merlin_torch_serving import diagnostics
from merlin_torch_serving.admin import Admin
from merlin_torch_serving.health import ModelHealth, ModelStatus
from merlin_torch_serving.process import (
    ProcessKeeper,
    ports_listened_by,
    signal_group,
    wait_for_group_exit,
)
from merlin_torch_serving.locations import repository_argument, server_repository
from merlin_torch_serving.supervision import Supervisor

__all__ = [
    "BINARY_ENV_VAR",
    "ModelHealth",
    "ModelStatus",
    "TritonServer",
    "find_tritonserver",
    "python_backend_directory",
]

BINARY_ENV_VAR = "MTS_TRITONSERVER"
MODEL_CONTROL_MODES = ("none", "explicit", "poll")

_PORT_ATTEMPTS = 3
_POLL_INTERVAL_S = 0.1
_REQUEST_TIMEOUT_S = 10.0
_GROUP_EXIT_TIMEOUT_S = 5.0
_SHARED_MEMORY_DIR = Path("/dev/shm")
_SHM_PREFIX_OPTION = "shm-region-prefix-name"



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

    The process runs in its own process group, is forked by a thread of its own (so it lives on
    when the thread that called start() ends) and is killed when this process dies.

    ``model_control``: ``"none"`` loads every model of the repository at start and no other;
    ``"explicit"`` loads ``load_models`` at start and then what ``load()`` asks for; ``"poll"``
    loads every model and then follows the repository, checked every ``poll_interval_s`` seconds
    (export an ensemble into it and it is served; exports are atomic, so a poll never sees half a
    model). In "none" mode the server runs tritonserver's explicit mode with every model loaded at
    start, which is what lets a failed model be reloaded on its own; ``load()`` and ``unload()``
    stay refused.

    ``restart_failed_models`` (default True): a python model whose stub process died fails every
    request while Triton still calls it READY; a thread checks every second and reloads such a
    model (beside the broken one, so nothing else is disturbed), logging it. The default is on
    because the alternative is an outage nobody is told about, and a reload touches only a model
    that already fails every request; failed reloads are retried with a growing wait, up to a
    minute. ``health()`` reports each model either way.
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
        poll_interval_s: int = 5,
        restart_failed_models: bool = True,
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
        if int(poll_interval_s) != poll_interval_s or poll_interval_s < 1:
            raise ValueError(f"poll_interval_s must be a whole number of seconds, at least 1, got {poll_interval_s!r}")
        #: a local Path, or the object-store URL as given
        self.repository = server_repository(repository)
        self._binary = binary
        self._backend_directory = Path(backend_directory) if backend_directory is not None else None
        self._requested_ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self._ports: dict[str, int] = {}
        self._model_control = model_control
        self._load_models = list(load_models)
        self._poll_interval_s = int(poll_interval_s)
        self._restart_failed_models = bool(restart_failed_models)
        self._keeper: ProcessKeeper | None = None
        self._supervisor: Supervisor | None = None
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
                self._supervisor = Supervisor(
                    self, Admin(self.http_url, _REQUEST_TIMEOUT_S), restart_failed_models=self._restart_failed_models
                )
                self._supervisor.start()
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
        if self._supervisor is not None:
            # before the server goes: its stubs ending now is no failure to repair
            self._supervisor.stop(self._stop_timeout_s)
            self._supervisor = None
        group = process.pid
        leftovers: list[int] = []
        try:
            # Until it is reaped, the server's pid (its group id) cannot be reused by another
            # process, so signalling the group cannot hit a stranger.
            if graceful and self._exit_code() is None:
                signal_group(group, signal.SIGINT)
                self._wait_for_exit(self._stop_timeout_s)
            if process.returncode is None:
                signal_group(group, signal.SIGKILL)
            try:
                process.wait(timeout=_GROUP_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ServerError(
                    f"tritonserver (pid {group}) did not exit {_GROUP_EXIT_TIMEOUT_S:g} s after SIGKILL; "
                    "it may be stuck in the kernel (check `ps -o pid,stat,wchan -p "
                    f"{group}`)"
                ) from None
            leftovers = wait_for_group_exit(group, _GROUP_EXIT_TIMEOUT_S)
            if not leftovers and self._shm_prefix:
                # A killed server cannot remove the shared memory it gave its stubs; with no
                # process of its group left, nothing uses regions under its prefix any more.
                _remove_shared_memory(self._shm_prefix)
        finally:
            self._process = None
            if self._keeper is not None and process.returncode is not None:
                self._keeper.close()  # its thread forked the server, which is gone now
                self._keeper = None
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
                f"tritonserver refused the repository index request (HTTP {status}): {diagnostics.error_text(body)}",
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
        self._load_or_raise(name, timeout_s)

    def reload(self, name: str, timeout_s: float = 120.0) -> None:
        """Load model ``name`` anew from the repository, in any model control mode, without a
        failed request: tritonserver loads the new instance (a new version, if one was exported
        with ``add_version=True``) beside the running one, switches to it once it is ready and
        then retires the old one; models that depend on it (its ensemble) follow. Returns once the
        new one answers.

        tritonserver reloads only a model whose version folder changed (a change to config.pbtxt
        alone is applied in place), so the folders of the versions it serves are touched first
        (their modification time, nothing else); in "poll" mode the next poll then reloads it."""
        self._require_running()
        if not isinstance(self.repository, Path):
            raise ServerError(
                f"could not reload model {name!r}: tritonserver reloads a model whose files changed, and this "
                f"server's repository {self.repository!r} is in object storage, where its folders cannot be "
                "touched; upload a new version (export with add_version=True) or restart the server"
            )
        served = [m.version for m in self.models() if m.name == name and m.state == "READY" and m.version]
        folders = [self.repository / name / str(version) for version in served] or [
            folder for folder in (self.repository / name).glob("[0-9]*") if folder.name.isdigit()
        ]
        offset = self._log_size()
        try:
            if not folders:
                raise FileNotFoundError(f"no version folder in {str(self.repository / name)!r}")
            for folder in folders:
                os.utime(folder)
        except OSError as error:
            raise ServerError(
                f"could not reload model {name!r}: tritonserver reloads a model whose files changed, and "
                f"touching its version folder failed ({error}); check the name and that the repository is writable"
            ) from error
        if self._model_control == "poll":
            self._wait_for_poll_reload(name, offset, timeout_s)
        else:
            self._load_or_raise(name, timeout_s)

    def health(self) -> list[ModelHealth]:
        """Each model of the repository index: its state, whether its python-backend stubs run
        (Triton still calls a model READY after its stub died), how many of its requests failed,
        the last error, and how often it was reloaded after a failure."""
        self._require_running()
        return self._supervisor.health()

    def _load_or_raise(self, name: str, timeout_s: float) -> None:
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
                f"tritonserver refused to unload model {name!r} (HTTP {status}): {diagnostics.error_text(body)}",
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

    def _wait_for_poll_reload(self, name: str, offset: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            loaded = diagnostics.load_outcome(self._log_since(offset), name)
            if loaded:
                return
            if loaded is False:
                raise self._load_error({name: self._reason_from_log(name, offset)})
            if time.monotonic() >= deadline:
                raise ModelLoadError(
                    {name: f"not reloaded {timeout_s:g} s after its version folder was touched (poll every {self._poll_interval_s} s)"},
                    self._log_tail(),
                )
            self._raise_if_exited()
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
            *self._model_control_args(),
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
        if self._keeper is None:
            self._keeper = ProcessKeeper(f"tritonserver-keeper-{os.getpid()}")
        try:
            self._process = self._keeper.popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=_server_environment(),
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as error:
            self._log_file.close()
            self._log_file = None
            raise ServerError(f"could not run {str(binary)!r}: {error}") from error
        self._pid = self._process.pid

    def _model_control_args(self) -> list[str]:
        if self._model_control == "poll":
            return ["--model-control-mode=poll", f"--repository-poll-secs={self._poll_interval_s}"]
        if self._model_control == "none":
            # explicit with everything loaded at start: the same models as "none", and a failed
            # one can be reloaded on its own (load()/unload() stay refused, see _require_explicit)
            return ["--model-control-mode=explicit", "--load-model=*"]
        return ["--model-control-mode=explicit"]

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
            if ports <= ports_listened_by(self._pid) and self._is_live():
                break
            if time.monotonic() >= deadline:
                raise ServerStartTimeoutError(
                    self._start_timeout_s, self._what_start_waits_for(ports), self._log_tail()
                )
            time.sleep(_POLL_INTERVAL_S)
        if self._model_control in ("none", "poll"):
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
        loading = diagnostics.still_loading(self.logs())
        if loading:
            return f"model(s) {_names(loading)} to finish loading; the endpoints open only after that"
        missing = sorted(ports - ports_listened_by(self._pid))
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
        reason = diagnostics.error_text(body)
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
                + (" and follows its changes" if self._model_control == "poll" else "")
                + "; reload() reloads one of them"
            )

    def _raise_if_exited(self) -> None:
        code = self._exit_code()
        if code is None:
            return
        in_use = diagnostics.port_in_use(self.logs())
        if in_use:
            raise PortInUseError(*in_use, self._log_tail())
        raise ServerExitedError(code, self._log_tail())

    def _load_error(self, failures: Mapping[str, str]) -> ModelLoadError:
        failures = diagnostics.with_dependency_failures(failures)
        missing = diagnostics.missing_backends(failures)
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
        return diagnostics.log_tail(self.logs())

    def _log_since(self, since_byte: int) -> str:
        if self._log_path is None:
            return ""
        with open(self._log_path, "rb") as log:
            log.seek(since_byte)
            return log.read().decode("utf-8", errors="replace")

    def _reason_from_log(self, name: str, since_byte: int = 0) -> str:
        """The server's error lines about model ``name``, for failures its API words vaguely."""
        if self._log_path is None:
            return ""
        return diagnostics.model_errors(self._log_since(since_byte), name)


# -- helpers without state ------------------------------------------------------------------------


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


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _names(names: Sequence[str]) -> str:
    return ", ".join(repr(name) for name in names)


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
