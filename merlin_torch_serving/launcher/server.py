"""Launch and supervise a local tritonserver on a model repository: the public face of ``launcher``.

``TritonServer`` checks what it is asked for (``launcher.config``), finds the binary and its
backends (``launcher.locate``), runs the process (``launcher.child``), waits until it serves and
loads models through its admin endpoints (``launcher.running``, ``launcher.admin``), turns its log
into errors (``launcher.diagnostics``) and watches its models (``launcher.supervision``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from merlin_torch_serving.backends.layout import python_backend_directory
from merlin_torch_serving.client.health import ModelHealth, ModelStatus, with_services
from merlin_torch_serving.client.transport import close_idle_http_connections
from merlin_torch_serving.exceptions import PortInUseError, ServerError
from merlin_torch_serving.launcher import access, preflight
from merlin_torch_serving.launcher.child import ServerLog, ServerProcess, free_ports, new_shm_prefix
from merlin_torch_serving.launcher.config import DEFAULT_MEMORY_GROWTH_LIMIT, Ports, ServerConfig
from merlin_torch_serving.launcher.failover import Failover
from merlin_torch_serving.launcher.locate import (
    BINARY_ENV_VAR,
    backend_directory,
    backends_in,
    find_tritonserver,
    server_environment,
)
from merlin_torch_serving.launcher.running import RunningServer
from merlin_torch_serving.launcher.supervision import Supervisor
from merlin_torch_serving.launcher.warmup import warm_up_ensembles

__all__ = [
    "BINARY_ENV_VAR",
    "ModelHealth",
    "ModelStatus",
    "TritonServer",
    "find_tritonserver",
    "python_backend_directory",
]

#: starts tried when a port the OS assigned was taken before the server could bind it
_PORT_ATTEMPTS = 3


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

    Safe by default: the server listens on ``host`` only, loopback unless told otherwise (pass
    ``host="0.0.0.0"`` to serve every interface), and its ``restricted_apis`` (the model
    repository's load, unload and index, shared memory, statistics, trace and logging) answer
    only requests that carry ``admin_key`` in the ``mts-admin-key`` header, whatever the host.
    The key is ``$MTS_ADMIN_KEY`` when set, else made anew for each server; this object's own
    calls send it, ``admin_key`` gives it, and while the server runs it is also in an owner-only
    file per port (``launcher.access``) where ``Client`` and the command line of the same user
    find it. Inference, metadata, health and model configurations stay open.
    ``restricted_apis=()`` lifts the restriction.

    ``failover`` (default on; ``$MTS_FAILOVER=0`` turns the default off): every python model an
    ensemble runs gets a second instance and an idle standby, and the moment one of its stubs
    dies its ensembles switch to the standby until it is reloaded, so only the requests inside
    the dead stub fail (``launcher.failover``; it costs two more stubs per python step). Not in
    "poll" mode. ``wait_for_failover()`` returns once every python model has its standby.

    ``memory_growth_limit`` (default 0.05): a python model whose idle stubs hold 5 % (and at
    least 32 MB) more memory than they started with, as after a very big request, is started
    afresh without a failed request, to give it back (``launcher.recycling``); None never does.
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
        host: str = access.LOOPBACK_HOST,
        admin_key: str | None = None,
        restricted_apis: Sequence[str] = access.DEFAULT_RESTRICTED_APIS,
        failover: bool | None = None,
        memory_growth_limit: float | None = DEFAULT_MEMORY_GROWTH_LIMIT,
    ):
        self.config = ServerConfig(
            repository=repository if isinstance(repository, str) else Path(repository),
            binary=Path(binary) if binary is not None else None,
            backend_directory=Path(backend_directory) if backend_directory is not None else None,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            model_control=model_control,
            load_models=load_models,
            poll_interval_s=poll_interval_s,
            restart_failed_models=restart_failed_models,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
            log_verbose=log_verbose,
            extra_args=extra_args,
            log_path=Path(log_path) if log_path is not None else None,
            host=host,
            admin_key=admin_key
            or os.environ.get(access.ADMIN_KEY_ENV_VAR)
            or access.new_admin_key(),
            restricted_apis=restricted_apis,
            failover=failover if failover is not None else _failover_by_default(),
            memory_growth_limit=memory_growth_limit,
        )
        self.repository = self.config.repository
        self._log = ServerLog(self.config.log_path)
        self._backend_directory = self.config.backend_directory
        self._running: RunningServer | None = None
        self._supervisor: Supervisor | None = None
        # kept after stop(), like the pid: callers check that they are free again
        self._pid: int | None = None
        self._ports: Ports | None = None
        self._key_files: list[Path] = []
        self._standby_repository: Path | None = None

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> TritonServer:
        """Start the server and return once it serves, its ensembles warmed end to end
        (``launcher.warmup``); on any failure it is stopped, then raised."""
        if self._running is not None:
            raise ServerError(
                f"this TritonServer already runs (pid {self._pid}); call stop() before starting it"
                " again"
            )
        if isinstance(self.repository, Path) and not self.repository.is_dir():
            raise ServerError(
                "pass the folder that holds the model folders (the one Ensemble.export wrote"
                f" into): model repository {str(self.repository)!r} is not a directory"
            )
        preflight.check(self.repository, self.config.requested_ports)
        binary = find_tritonserver(self.config.binary)
        self._backend_directory = self.config.backend_directory or backend_directory(binary)
        deadline = time.monotonic() + self.config.start_timeout_s
        attempts_left = _PORT_ATTEMPTS
        while True:
            assigned = free_ports(
                sum(port is None for port in self.config.requested_ports.values())
            )
            self._running = self._launch(binary, assigned)
            try:
                self._running.wait_until_serving(deadline)
                self._warm_up(m.name for m in self._running.admin.models() if m.state == "READY")
                self._supervisor = Supervisor(
                    self,
                    self._running.admin,
                    restart_failed_models=self.config.restart_failed_models,
                    failover=self._failover(self._running),
                    memory_growth_limit=self.config.memory_growth_limit,
                )
                self._supervisor.start()
                if self.config.restricted_apis:
                    ports = self._running.ports
                    self._key_files = access.write_key_files(
                        self.config.admin_key, (ports.http, ports.grpc)
                    )
                return self
            except PortInUseError as error:
                self._shut_down(graceful=False)
                attempts_left -= 1
                # A port the OS gave us may be taken between our probe and the server's bind.
                if error.port not in assigned or attempts_left == 0:
                    raise
            except BaseException:
                # Nothing is in flight yet, so there is nothing to wait for.
                self._shut_down(graceful=False)
                raise

    def stop(self) -> None:
        """Stop the server and every process of its group; safe to call more than once.

        SIGINT lets tritonserver finish its requests and unload its models; SIGKILL after
        stop_timeout_s makes sure neither it nor a python-backend stub outlives the call.
        tritonserver also waits for every open HTTP connection to close: the idle ones of this
        process's ``Client``s are closed first (they open a new one when called again), while a
        client in another process holds the stop up to the exit timeout unless it is closed.
        """
        self._shut_down(graceful=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what it is ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The pid of the last started tritonserver.

        It is kept after stop() so callers can check it is gone.
        """
        return self._pid

    @property
    def is_running(self) -> bool:
        return self._running is not None and self._running.is_running

    @property
    def http_url(self) -> str:
        """``<address>:<port>`` (``127.0.0.1`` unless ``host`` names another), the form
        tritonclient.http takes."""
        return f"{self.config.connect_host}:{self._port('http')}"

    @property
    def grpc_url(self) -> str:
        """``<address>:<port>``, the form tritonclient.grpc takes."""
        return f"{self.config.connect_host}:{self._port('grpc')}"

    @property
    def metrics_url(self) -> str:
        """``<address>:<port>``; the Prometheus metrics are at ``http://<metrics_url>/metrics``."""
        return f"{self.config.connect_host}:{self._port('metrics')}"

    @property
    def host(self) -> str:
        """The address the server listens on (``0.0.0.0``: every interface)."""
        return self.config.host

    @property
    def admin_key(self) -> str:
        """The key its restricted APIs want in the ``mts-admin-key`` header (gRPC metadata)."""
        return self.config.admin_key

    @property
    def admin_key_files(self) -> list[Path]:
        """The owner-only files holding ``admin_key`` while the server runs, one per port."""
        return list(self._key_files)

    def logs(self) -> str:
        """Everything the server wrote to stdout and stderr since the last start."""
        return self._log.text()

    def backends(self) -> list[str]:
        """Backends this server can run: its backend directory's subfolders, plus "ensemble"."""
        if self._backend_directory is None:
            self._backend_directory = backend_directory(find_tritonserver(self.config.binary))
        return backends_in(self._backend_directory)

    def models(self) -> list[ModelStatus]:
        """The repository index: one ``ModelStatus`` per model folder.

        Each holds the state of every version the server knows.
        """
        return self._require_running().admin.models()

    def health(self) -> list[ModelHealth]:
        """Each model of the repository index: its state, whether its python-backend stubs run
        (Triton still calls a model READY after its stub died), how many of its requests failed,
        the last error, how often it was reloaded after a failure, and whether the outside services
        its operators call (a feature server) answer."""
        running = self._require_running()
        assert self._supervisor is not None  # started with the server
        return [
            with_services(health, _config_reader(running, health))
            for health in self._supervisor.health()
        ]

    def wait_for_failover(self, timeout_s: float = 120.0) -> set[str]:
        """Return once every python model the server runs has its standby (see the class's
        docstring), with their names; ``ServerError`` after ``timeout_s``."""
        running = self._require_running()
        assert self._supervisor is not None  # started with the server
        if not self.config.failover:
            raise ServerError(
                "this server runs without failover: pass failover=True (it is off in 'poll' mode)"
            )
        deadline = time.monotonic() + timeout_s
        while self._supervisor.pending(running.admin.models()):
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"python models still without a standby after {timeout_s:g} s:"
                    f" {', '.join(self._supervisor.pending(running.admin.models()))}",
                    running.log_tail(),
                )
            time.sleep(0.2)
        return self._supervisor.armed()

    # -- model control --------------------------------------------------------------------------

    def load(self, name: str, timeout_s: float = 120.0) -> None:
        """Load (or reload) model ``name`` from the repository, and warm it end to end if it is an
        ensemble (``launcher.warmup``); needs model_control="explicit"."""
        self._require_explicit("load")
        self._require_running().load(name, timeout_s)
        self._warm_up([name])

    def reload(self, name: str, timeout_s: float = 120.0) -> None:
        """Load model ``name`` anew from the repository, in any model control mode, without a
        failed request: tritonserver loads the new instance (a new version, if one was exported
        with ``add_version=True``) beside the running one, switches to it once it is ready and
        then retires the old one; models that depend on it (its ensemble) follow. An ensemble is
        reloaded with every model it runs, each before it, so its python steps start afresh too.
        Returns once the new one answers.

        tritonserver reloads only a model whose version folder changed (a change to config.pbtxt
        alone is applied in place), so the folders of the versions it serves are touched first
        (their modification time, nothing else); in "poll" mode the next poll then reloads it."""
        running = self._require_running()
        supervisor = self._supervisor
        running.reload(name, timeout_s, supervisor.load_config if supervisor else lambda _: None)

    def unload(self, name: str, timeout_s: float = 30.0) -> None:
        """Unload model ``name`` and wait until the server has released it; needs
        model_control="explicit"."""
        self._require_explicit("unload")
        self._require_running().unload(name, timeout_s)

    # -- helpers --------------------------------------------------------------------------------

    def _warm_up(self, models) -> None:
        """Send the ensembles among ``models`` their warm-up requests (``launcher.warmup``)."""
        warm_up_ensembles(self.repository, models, self.grpc_url, self.http_url)

    def _launch(self, binary: Path, assigned_ports: list[int]) -> RunningServer:
        assert self._backend_directory is not None
        ports = self._ports = self.config.ports(assigned_ports)
        shm_prefix = None if self.config.names_shared_memory else new_shm_prefix()
        if self.config.failover and self._standby_repository is None:
            self._standby_repository = Path(tempfile.mkdtemp(prefix="mts-standby-"))
        command = self.config.command(
            binary, self._backend_directory, ports, shm_prefix, self._standby_repository
        )
        process = ServerProcess(command, self._log, server_environment(), shm_prefix)
        self._pid = process.pid
        running = RunningServer(self.config, process, ports, self._log, self.backends)
        running.side_repository = self._standby_repository
        return running

    def _failover(self, running: RunningServer) -> Failover | None:
        if self._standby_repository is None:
            return None
        return Failover(
            running.admin,
            self.repository,
            self._standby_repository,
            load_timeout_s=self.config.start_timeout_s,
        )

    def _shut_down(self, *, graceful: bool) -> None:
        running = self._running
        if running is None:
            return
        unloading = None
        if graceful and self._supervisor is not None and self._supervisor.saw_death:
            unloading = self._supervisor.unloading()  # asks the server: while it still runs
        self._running = None
        access.remove_key_files(self._key_files, self.config.admin_key)
        self._key_files = []
        if self._supervisor is not None:
            # before the server goes: its stubs ending now is no failure to repair
            self._supervisor.stop(self.config.stop_timeout_s)
            self._supervisor = None
        if graceful:
            close_idle_http_connections(self._port("http"))
        running.stop(graceful=graceful, timeout_s=self.config.stop_timeout_s, unloading=unloading)
        if self._standby_repository is not None:
            shutil.rmtree(self._standby_repository, ignore_errors=True)
            self._standby_repository = None

    def _port(self, key: str) -> int:
        if self._ports is None:
            raise ServerError(
                f"the {key} port is chosen when the server starts; call start() first"
            )
        return int(getattr(self._ports, key))

    def _require_running(self) -> RunningServer:
        if self._running is None:
            raise ServerError(
                "tritonserver is not running; call start() or use the TritonServer in a `with`"
                " block first"
            )
        self._running.raise_if_exited()
        return self._running

    def _require_explicit(self, action: str) -> None:
        mode = self.config.model_control
        if mode != "explicit":
            raise ServerError(
                f"{action}() needs a server started with model_control='explicit'; this one runs"
                f" with model_control={mode!r}, which loads every model of the repository at start"
                + (" and follows its changes" if mode == "poll" else "")
                + "; reload() reloads one of them"
            )


def _config_reader(running: RunningServer, health: ModelHealth):
    """What reads the config of a ready python model (the only kind that calls outside services);
    None for other models."""
    if health.state != "READY" or health.stubs_alive is None:
        return None
    return partial(running.admin.model_config, health.name, health.version)


def _failover_by_default() -> bool:
    """On, unless ``$MTS_FAILOVER`` says 0, false, no or off (for machines short of memory)."""
    return os.environ.get("MTS_FAILOVER", "1").strip().lower() not in ("0", "false", "no", "off")
