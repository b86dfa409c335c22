"""A started tritonserver as Triton sees it: when it serves, and its models loaded, unloaded and
reloaded on request, with every failure turned into an error that quotes the server's log.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from merlin_torch_serving.client.health import ModelStatus
from merlin_torch_serving.exceptions import ModelLoadError, ServerError, ServerStartTimeoutError
from merlin_torch_serving.launcher import diagnostics, private_memory
from merlin_torch_serving.launcher.admin import Admin, Refused
from merlin_torch_serving.launcher.child import ServerLog, ServerProcess
from merlin_torch_serving.launcher.config import Ports, ServerConfig

_POLL_S = 0.1
logger = logging.getLogger("merlin_torch_serving")


class RunningServer:
    """One launched tritonserver: its process, its ports, its admin endpoints and its log.

    ``backends`` lists the backends it can run (for the error of a model that needs another).
    """

    def __init__(
        self,
        config: ServerConfig,
        process: ServerProcess,
        ports: Ports,
        log: ServerLog,
        backends: Callable[[], list[str]],
    ):
        self.config = config
        self.process = process
        self.ports = ports
        self.log = log
        self._backends = backends
        #: a second repository the server was started with (standby models), if any
        self.side_repository: Path | None = None
        self.http_url = f"{config.connect_host}:{ports.http}"
        self.admin = Admin(
            self.http_url,
            admin_key=config.admin_key if config.restricted_apis else None,
            log_tail=self.log_tail,
            before_error=self.raise_if_exited,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def is_running(self) -> bool:
        return self.process.exit_code() is None

    def raise_if_exited(self) -> None:
        code = self.process.exit_code()
        if code is not None:
            raise diagnostics.exit_error(code, self.log.text())

    def log_tail(self) -> str:
        return diagnostics.log_tail(self.log.text())

    def stop(
        self, *, graceful: bool, timeout_s: float, unloading: Iterable[str] | None = None
    ) -> None:
        """End the server (``ServerProcess.stop``). ``unloading``, after a python-backend stub
        died: the models that will unload. tritonserver never unloads the model version a dead stub
        served, so it would wait out its exit timeout; the server is ended as soon as its requests
        in flight are answered and those models unloaded (their steps closed what they hold)."""
        offset = self.log.size()
        expected = set(unloading or ())

        def settled() -> bool:
            log = self.log.since(offset)
            return diagnostics.requests_drained(log) and expected <= diagnostics.unloaded(log)

        self.process.stop(
            graceful=graceful,
            timeout_s=timeout_s,
            settled=settled if unloading is not None else None,
        )

    # -- starting -------------------------------------------------------------------------------

    def wait_until_serving(self, deadline: float) -> None:
        """Return once the server is serving.

        That is, once it answers on its ports and the models asked for at start are loaded.
        """
        ports = set(self.ports)
        while True:
            self.raise_if_exited()
            # Listening sockets owned by the server prove the ports are its own: it logs
            # "Started ..." before it binds, and a stranger on the port could answer /health.
            if ports <= self.process.listening_ports() and self.admin.is_live():
                break
            if time.monotonic() >= deadline:
                silent = sorted(ports - self.process.listening_ports())
                raise self._start_timeout(
                    diagnostics.start_awaits(self.log.text(), silent, self.http_url)
                )
            time.sleep(_POLL_S)
        if self.config.model_control in ("none", "poll"):
            failures = {
                model.name: model.reason or diagnostics.model_errors(self.log.text(), model.name)
                for model in self._settled_models(deadline)
                if model.state != "READY"
            }
        else:
            failures = {}
            for name in self.config.load_models:
                try:
                    reason = self.try_load(name, max(0.001, deadline - time.monotonic()))
                except TimeoutError:
                    raise self._start_timeout(f"model {name!r} to load") from None
                if reason is not None:
                    failures[name] = reason
        if failures:
            raise self.load_error(failures)
        prefix = self.process.shm_prefix  # None: the caller named the regions (extra_args)
        exposed = private_memory.exposed_regions(prefix) if prefix else []
        if exposed:
            logger.warning(
                "the python backend's shared memory (%s) can be read by other users of this"
                " machine, and with it every request: this kernel refused the seccomp filter that"
                " keeps it owner-only (see launcher.private_memory)",
                ", ".join(str(region) for region in exposed[:3]),
            )

    def _settled_models(self, deadline: float) -> list[ModelStatus]:
        while True:
            models = self.admin.models()
            busy = [model.name for model in models if model.state in ("LOADING", "UNLOADING")]
            if not busy:
                return models
            if time.monotonic() >= deadline:
                raise self._start_timeout(f"model(s) {diagnostics.names(busy)} to finish loading")
            time.sleep(_POLL_S)

    def _start_timeout(self, waiting_for: str) -> ServerStartTimeoutError:
        return ServerStartTimeoutError(self.config.start_timeout_s, waiting_for, self.log_tail())

    # -- models ---------------------------------------------------------------------------------

    def try_load(self, name: str, timeout_s: float, config: str | None = None) -> str | None:
        """Ask the server to load ``name`` (with ``config``, JSON, in place of its config.pbtxt):
        None once it is loaded, else why it failed to; ``TimeoutError`` when it is still loading
        after ``timeout_s``."""
        log_offset = self.log.size()
        try:
            self.admin.load(name, timeout_s, config=config)
        except Refused as refusal:
            return diagnostics.load_refusal(refusal.reason, self.log.since(log_offset), name)
        return None

    def load(self, name: str, timeout_s: float, config: str | None = None) -> None:
        """Load (or reload) ``name`` (with ``config``, JSON, in place of its config.pbtxt) and
        return once it is loaded.

        Raises ``ModelLoadError`` if it fails to load.
        """
        try:
            reason = self.try_load(name, timeout_s, config)
        except TimeoutError:
            raise ModelLoadError(
                {
                    name: (
                        f"still loading after timeout_s={timeout_s:g} s (the server keeps loading"
                        " it in the background); pass a larger timeout_s if the model is slow to"
                        " initialize"
                    )
                },
                self.log_tail(),
            ) from None
        if reason is not None:
            raise self.load_error({name: reason})

    def unload(self, name: str, timeout_s: float) -> None:
        """Unload ``name`` and wait until the server has released it."""
        deadline = time.monotonic() + timeout_s
        try:
            self.admin.unload(name, timeout_s)
        except TimeoutError:
            pass  # still unloading: waited for below
        except Refused as refusal:
            raise ServerError(
                f"tritonserver refused to unload model {name!r} (HTTP {refusal.status}):"
                f" {refusal.reason}",
                self.log_tail(),
            ) from None
        while True:
            state = next((model.state for model in self.admin.models() if model.name == name), None)
            if state not in ("READY", "UNLOADING"):
                return
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"model {name!r} is still {state} {timeout_s:g} s after its unload was asked"
                    " for; a model whose finalize() hangs keeps it there (see the log), or pass a"
                    " larger timeout_s",
                    self.log_tail(),
                )
            time.sleep(_POLL_S)

    def reload(
        self,
        name: str,
        timeout_s: float,
        config_of: Callable[[str], str | None] = lambda model: None,
    ) -> None:
        """Load ``name`` anew beside the running instance (see ``TritonServer.reload``); an
        ensemble with every model it runs, each before it. ``config_of(model)`` gives the config
        (JSON) to load a model with, None for its config.pbtxt."""
        repository = self._repository_of(name)
        for step in ensemble_steps(repository, name):
            self.reload(step, timeout_s, config_of)
        served = [
            m.version
            for m in self.admin.models()
            if m.name == name and m.state == "READY" and m.version
        ]
        folders = [repository / name / str(version) for version in served] or [
            folder for folder in (repository / name).glob("[0-9]*") if folder.name.isdigit()
        ]
        offset = self.log.size()
        try:
            if not folders:
                raise FileNotFoundError(f"no version folder in {str(repository / name)!r}")
            for folder in folders:
                os.utime(folder)
        except OSError as error:
            raise ServerError(
                f"could not reload model {name!r}: tritonserver reloads a model whose files"
                f" changed, and touching its version folder failed ({error}); check the name and"
                " that the repository is writable"
            ) from error
        if self.config.model_control == "poll":
            self._wait_for_poll_reload(name, offset, timeout_s)
        else:
            self.load(name, timeout_s, config=config_of(name))

    def _repository_of(self, name: str) -> Path:
        """The local repository that holds model ``name`` (a standby's is the side repository)."""
        repository = self.config.repository
        if (
            self.side_repository is not None
            and (self.side_repository / name).is_dir()
            and not (isinstance(repository, Path) and (repository / name).is_dir())
        ):
            repository = self.side_repository
        if not isinstance(repository, Path):
            raise ServerError(
                f"could not reload model {name!r}: tritonserver reloads a model whose files"
                f" changed, and this server's repository {repository!r} is in object storage, where"
                " its folders cannot be touched; upload a new version (export with"
                " add_version=True) or restart the server"
            )
        return repository

    def _wait_for_poll_reload(self, name: str, offset: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            log = self.log.since(offset)
            loaded = diagnostics.load_outcome(log, name)
            if loaded:
                return
            if loaded is False:
                raise self.load_error({name: diagnostics.model_errors(log, name)})
            if time.monotonic() >= deadline:
                raise ModelLoadError(
                    {
                        name: (
                            f"not reloaded {timeout_s:g} s after its version folder was touched "
                            f"(poll every {self.config.poll_interval_s} s)"
                        )
                    },
                    self.log_tail(),
                )
            self.raise_if_exited()
            time.sleep(_POLL_S)

    def load_error(self, failures: Mapping[str, str]) -> ModelLoadError:
        return diagnostics.load_error(failures, self._backends(), self.log.text())


def model_config_file(repository: Path | str, model: str) -> dict | None:
    """``model``'s config.pbtxt as JSON (the form the load API takes); None when it cannot be
    read here (a repository in object storage, no such file, not a model config)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    if not isinstance(repository, Path):
        return None
    try:
        text = (repository / model / "config.pbtxt").read_text()
        message = text_format.Parse(text, model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError):
        return None
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def ensemble_steps(repository: Path | str, name: str) -> list[str]:
    """The models ensemble ``name`` runs, as its config.pbtxt says (none if it is no ensemble)."""
    config = model_config_file(repository, name) or {}
    if config.get("platform") != "ensemble":
        return []
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return list(dict.fromkeys(step["model_name"] for step in steps if step.get("model_name")))
