"""What a ``TritonServer`` is asked to be, checked once, and the tritonserver command line it makes.

Nothing here starts a process, so every option and the command it becomes can be tested alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from merlin_torch_serving.deployment.locations import repository_argument, server_repository
from merlin_torch_serving.launcher import access

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
#: reload a python model once its stubs hold this fraction more memory than they started with:
#: what a stub keeps of a very big request is in tritonserver's memory too (their shared memory),
#: so 5 % of the stubs is about 10 % of the server
DEFAULT_MEMORY_GROWTH_LIMIT = 0.05
#: the python backend's option that names its shared-memory regions
SHM_PREFIX_OPTION = "shm-region-prefix-name"


class Ports(NamedTuple):
    http: int
    grpc: int
    metrics: int


@dataclass(frozen=True)
class ServerConfig:
    """The options of ``TritonServer`` (see its docstring), validated and normalized.

    Ports left as None are chosen when the server starts; ``binary`` and ``backend_directory``
    left as None are found then too (see ``launcher.locate``). ``admin_key`` guards
    ``restricted_apis`` (see ``launcher.access``); it is left out of the repr, so logging a config
    does not leak it.
    """

    #: a local folder, or an object-store URL tritonserver reads itself (see ``locations``)
    repository: Path | str
    binary: Path | None = None
    backend_directory: Path | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    model_control: str = "none"
    load_models: Sequence[str] = ()
    poll_interval_s: int = 5
    restart_failed_models: bool = True
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 20.0
    log_verbose: int = 0
    extra_args: Sequence[str] = ()
    log_path: Path | None = None
    host: str = access.LOOPBACK_HOST
    admin_key: str = field(default_factory=access.new_admin_key, repr=False)
    restricted_apis: Sequence[str] = access.DEFAULT_RESTRICTED_APIS
    failover: bool = True
    memory_growth_limit: float | None = DEFAULT_MEMORY_GROWTH_LIMIT

    def __post_init__(self) -> None:
        if not str(self.host).strip() or " " in str(self.host):
            raise ValueError(
                f"host must be the address to listen on (e.g. '127.0.0.1', or '0.0.0.0' for every"
                f" interface), got {self.host!r}"
            )
        if self.model_control not in MODEL_CONTROL_MODES:
            raise ValueError(
                f"model_control must be one of {MODEL_CONTROL_MODES}, got {self.model_control!r}"
            )
        if isinstance(self.load_models, str):
            raise TypeError(
                "load_models must be a sequence of model names, got the string"
                f" {self.load_models!r}"
            )
        if self.load_models and self.model_control != "explicit":
            raise ValueError(
                f"load_models={list(self.load_models)!r} needs model_control='explicit'; with"
                f" model_control={self.model_control!r} the server loads every model in the"
                " repository"
            )
        if self.memory_growth_limit is not None and not self.memory_growth_limit > 0:
            raise ValueError(
                "memory_growth_limit must be a positive fraction (0.05: reload a python model whose"
                f" stubs grew by 5 %) or None, got {self.memory_growth_limit!r}"
            )
        for name in ("start_timeout_s", "stop_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if int(self.poll_interval_s) != self.poll_interval_s or self.poll_interval_s < 1:
            raise ValueError(
                "poll_interval_s must be a whole number of seconds, at least 1, got"
                f" {self.poll_interval_s!r}"
            )
        normalized = {
            "repository": server_repository(self.repository),
            "binary": _optional_path(self.binary),
            "backend_directory": _optional_path(self.backend_directory),
            "load_models": tuple(self.load_models),
            "poll_interval_s": int(self.poll_interval_s),
            "restart_failed_models": bool(self.restart_failed_models),
            "start_timeout_s": float(self.start_timeout_s),
            "stop_timeout_s": float(self.stop_timeout_s),
            "log_verbose": int(self.log_verbose),
            "extra_args": tuple(str(arg) for arg in self.extra_args),
            "log_path": _optional_path(self.log_path),
            "host": self.host.strip(),
            "admin_key": access.checked_admin_key(self.admin_key),
            "restricted_apis": access.checked_restricted_apis(self.restricted_apis),
            # standbys are loaded and switched to through the load API, which poll mode closes
            "failover": bool(self.failover) and self.model_control != "poll",
        }
        for name, value in normalized.items():
            object.__setattr__(self, name, value)

    @property
    def connect_host(self) -> str:
        """The address this machine's clients reach the server at."""
        return access.connect_host(self.host)

    @property
    def requested_ports(self) -> dict[str, int | None]:
        return {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}

    @property
    def names_shared_memory(self) -> bool:
        """Whether ``extra_args`` name the python backend's shared memory.

        If they do, the caller owns it.
        """
        return any(SHM_PREFIX_OPTION in arg for arg in self.extra_args)

    def ports(self, assigned: Sequence[int]) -> Ports:
        """The requested ports, with the unset ones taken in order from ``assigned``."""
        free = iter(assigned)
        return Ports(
            **{
                key: port if port is not None else next(free)
                for key, port in self.requested_ports.items()
            }
        )

    def command(
        self,
        binary: Path,
        backend_directory: Path,
        ports: Ports,
        shm_prefix: str | None,
        standby_repository: Path | None = None,
    ) -> list[str]:
        """The tritonserver command line; ``shm_prefix`` names the python backend's shared memory
        (None when ``extra_args`` name it); ``standby_repository`` is a second repository, for the
        standby models of failover (``launcher.failover``)."""
        return [
            str(binary),
            f"--model-repository={repository_argument(self.repository)}",
            *([f"--model-repository={standby_repository}"] if standby_repository else []),
            f"--backend-directory={backend_directory}",
            f"--http-port={ports.http}",
            f"--grpc-port={ports.grpc}",
            f"--metrics-port={ports.metrics}",
            # tritonserver listens on every interface unless told otherwise
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            *access.restriction_args(self.admin_key, self.restricted_apis),
            *self._model_control_args(),
            # One bad model must not take the others down; readiness is judged by the launcher
            # instead.
            "--exit-on-error=false",
            # gRPC request and response objects kept for reuse hold on to the largest tensors they
            # ever carried: after one request of a million clicks, tens of megabytes for good.
            "--grpc-infer-allocation-pool-size=0",
            # Let the server finish its own shutdown before stop() resorts to SIGKILL.
            f"--exit-timeout-secs={max(1, math.floor(self.stop_timeout_s * 0.75))}",
            f"--log-verbose={self.log_verbose}",
            *([f"--backend-config=python,{SHM_PREFIX_OPTION}={shm_prefix}"] if shm_prefix else []),
            *self.extra_args,
        ]

    def _model_control_args(self) -> list[str]:
        if self.model_control == "poll":
            return ["--model-control-mode=poll", f"--repository-poll-secs={self.poll_interval_s}"]
        if self.model_control == "none":
            # explicit with everything loaded at start: the same models as "none", and a failed
            # one can be reloaded on its own (load() and unload() stay refused by TritonServer)
            return ["--model-control-mode=explicit", "--load-model=*"]
        return ["--model-control-mode=explicit"]


def _optional_path(value: str | os.PathLike | None) -> Path | None:
    return Path(value) if value is not None else None
