"""What is true of each served model, as the launcher and the client both report it: its row of
the repository index (``ModelStatus``), and whether it answers (``ModelHealth``).

Triton keeps answering READY, to its readiness endpoints and its repository index, for a python
model whose stub process died: every request then fails with "Stub process ... is not healthy",
forever, and nothing is logged. The launcher sees the stubs themselves (``launcher.stubs``); a
client of a server in another process sends a model a request of no rows instead
(``probe_request``, ``stub_answered``). Both read the server's answers with the parsers here.

A model can also depend on a service outside the server (a feature server, a store of sessions):
its step's config names them (``SERVICES_PARAMETER``), and both reports ask each whether it
answers (``service_health``; stores through ``stores.reachability``); a model whose service is
down still answers (with defaults, or from the request alone), so it is ``degraded``, not
unhealthy.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import MerlinTorchServingError
from merlin_torch_serving.stores.reachability import store_error


@dataclass(frozen=True)
class ModelStatus:
    """One row of the server's repository index."""

    name: str
    #: None when the server has never tried to load the model
    version: int | None
    #: "READY", "LOADING", "UNLOADING" or "UNAVAILABLE"; None when never loaded
    state: str | None
    #: why the model is UNAVAILABLE, in the server's words ("unloaded" after unload)
    reason: str = ""


def model_statuses(index: Iterable[Mapping] | Mapping) -> list[ModelStatus]:
    """The rows of a repository index as tritonclient returns it: a list of entries over HTTP, a
    ``{"models": [...]}`` message over gRPC (``as_json=True``)."""
    entries = index.get("models", []) if isinstance(index, Mapping) else index
    return [
        ModelStatus(
            name=entry["name"],
            version=int(entry["version"]) if entry.get("version") else None,
            state=entry.get("state") or None,
            reason=(entry.get("reason") or "").strip(),
        )
        for entry in entries
    ]


#: the step config parameter that lists a step's outside services (export.config has its twin)
SERVICES_PARAMETER = "merlin_torch_serving.services"
#: the longest a health report waits for one outside service
SERVICE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ServiceHealth:
    """An outside service a model calls while it serves, as this process sees it now."""

    name: str
    url: str
    reachable: bool
    #: why it is not reachable
    error: str = ""


@dataclass(frozen=True)
class ModelHealth:
    """A served model version, as far as the server and its processes tell."""

    name: str
    version: int | None
    #: the repository index's state: "READY", "LOADING", "UNLOADING", "UNAVAILABLE", None
    state: str | None
    #: whether every python-backend stub of the model runs; None for models without stubs
    #: (ensembles, libtorch) or when it cannot be seen (a server this process does not own)
    stubs_alive: bool | None
    #: requests of this version the server answered with an error (its statistics); None if unknown
    failed_requests: int | None
    #: why the model is not healthy, or the last failure it recovered from
    last_error: str = ""
    #: how many times the launcher reloaded it because it had failed: reloads, not failures (one
    #: reload repairs every stub that died before it began); counted once the reload returns,
    #: a moment after the model answers again
    restarts: int = 0
    #: the outside services its operators call (a feature server), and whether each answers
    services: tuple[ServiceHealth, ...] = ()
    #: the standby its ensembles run instead of it (failover), "" when they run the model itself
    standby: str = ""

    @property
    def healthy(self) -> bool:
        return self.state == "READY" and self.stubs_alive is not False and not self.standby

    @property
    def degraded(self) -> bool:
        """It answers, but a service it calls does not (a feature server: its features get their
        defaults; an answer log's folder: its answers are dropped)."""
        return any(not service.reachable for service in self.services)


def with_services(health: ModelHealth, config_of: Callable[[], Mapping] | None) -> ModelHealth:
    """``health`` with the outside services its model's config (``config_of()``, None for a model
    not ready) names, each asked now; as it is when the config cannot be read."""
    try:
        config = config_of() if config_of else {}
    except MerlinTorchServingError:
        return health
    services = service_health(config)
    return replace(health, services=services) if services else health


def names_services(config: Mapping) -> bool:
    """Whether a model config names outside services (which ``service_health`` asks)."""
    return bool(config.get("parameters", {}).get(SERVICES_PARAMETER, {}).get("string_value"))


def service_health(config: Mapping) -> tuple[ServiceHealth, ...]:
    """Whether each outside service a model config names answers: an HTTP service its health
    endpoint (``<url>/health``) within ``SERVICE_TIMEOUT_S``, a store ``store_error``'s check, a
    folder (``file://``) whether it can be written to (``folder_error``). Services at one URL (the
    store a step's sessions, rules and trending counts share) are asked once."""
    listed = config.get("parameters", {}).get(SERVICES_PARAMETER, {}).get("string_value")
    if not listed:
        return ()
    errors: dict[str, str | None] = {}
    report = []
    for service in json.loads(listed):
        url = service["url"].rstrip("/")
        if url not in errors:
            errors[url] = _service_error(url)
        error = errors[url]
        if error is not None:  # None: not on this machine, it cannot be told from here
            report.append(ServiceHealth(service["name"], url, not error, error))
    return tuple(report)


def _service_error(url: str) -> str | None:
    """Why the service at ``url`` does not answer ("" when it does; see ``service_health``)."""
    if url.startswith("file://"):  # a folder a model writes (an answer log's)
        return folder_error(urllib.parse.urlparse(url).path)
    if not url.startswith(("http://", "https://")):  # a store: Redis, or an embedded file
        return store_error(url, SERVICE_TIMEOUT_S)
    try:
        with urllib.request.urlopen(url + "/health", timeout=SERVICE_TIMEOUT_S) as answer:
            return "" if answer.status == 200 else f"HTTP {answer.status} from /health"
    except OSError as failure:
        return f"{type(failure).__name__}: {failure}"


#: a folder a model writes to (an answer log's) with less free space than this is full
MIN_FREE_BYTES = 64 * 1024


def folder_error(path: str) -> str | None:
    """Why a model cannot write into the folder at ``path`` ("" when it can: it is writable with
    ``MIN_FREE_BYTES`` free); None when there is no such folder here (a server on another machine
    writes it, or it has not written it yet)."""
    if not os.path.isdir(path):
        return None
    if not os.access(path, os.W_OK):
        return f"the folder {path!r} cannot be written to"
    usage = os.statvfs(path)
    free = usage.f_bavail * usage.f_frsize
    if free < MIN_FREE_BYTES:
        return f"the filesystem of the folder {path!r} is full ({free:,} bytes free)"
    return ""


#: how many failures tritonserver (2.51) counts for each request of an ensemble that fails in a
#: step: one when the step answers with the error, one when the ensemble's request ends
ENSEMBLE_FAILURE_COUNTS = 2


def failed_requests(
    statistics: Mapping, ensembles: Iterable[str] = ()
) -> dict[tuple[str, int], int]:
    """``(model, version) -> requests answered with an error`` since each version loaded, from the
    server's inference statistics (gRPC's JSON leaves zero counts out); ``ensembles`` names the
    ensembles among the models, whose failures the server counts twice."""
    ensembles = set(ensembles)
    return {
        (entry["name"], int(entry.get("version") or 0)): int(
            entry["inference_stats"].get("fail", {}).get("count", 0)
        )
        // (ENSEMBLE_FAILURE_COUNTS if entry["name"] in ensembles else 1)
        for entry in statistics.get("model_stats", [])
    }


#: a failover standby's name (``launcher.standby``): ``<model>-standby``, ``<model>-standby-<n>``
STANDBY_NAME = re.compile(r"^(.+)-standby(?:-(\d+))?$")


def standbys_run(configs: Iterable[Mapping]) -> dict[str, str]:
    """``model -> its standby`` for each model whose standby an ensemble among ``configs`` runs in
    its place (the launcher's failover switched it there)."""
    found = {}
    for config in configs:
        for step in config.get("ensemble_scheduling", {}).get("step", []):
            match = STANDBY_NAME.match(step.get("model_name", ""))
            if match:
                found[match.group(1)] = match.group(0)
    return found


def standby_error(standby: str) -> str:
    """What a model's health says while its ensembles run its standby ``standby``."""
    return (
        f"its ensembles run its standby {standby!r} until it answers again (the launcher switches"
        " them back once all its stubs run)"
    )


def expected_stubs(config: Mapping) -> int | None:
    """How many stub processes a model config asks for: one per instance of a python model;
    None for models that run without stubs."""
    if config.get("backend") != "python":
        return None
    return sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1


def probe_request(config: Mapping) -> dict[str, np.ndarray] | None:
    """A request of no rows for a python model, from its config: it reaches the model's stub
    (the answer to it says whether the stub runs) and costs nothing. None for models without
    stubs. A model Triton batches gets one batch item of no rows (``[1, 0]``): a batch of 0 items
    is refused before it reaches the stub, so its answer would prove nothing."""
    if expected_stubs(config) is None:
        return None
    batch = [1] if int(config.get("max_batch_size", 0)) > 0 else []
    arrays = {}
    for tensor in config.get("input", []):
        dims = [int(d) for d in tensor.get("dims", [-1])]
        if dims and dims[0] != -1:
            return None  # a fixed first dimension cannot hold no rows
        try:
            numpy_dtype = wire.numpy_dtype(tensor["data_type"])
        except TypeError:
            return None  # e.g. BF16, which numpy has not
        # ragged offsets (rows + 1 entries) hold a single 0 for no rows
        rows = 1 if tensor["name"].endswith(wire.OFFSETS_SUFFIX) else 0
        arrays[tensor["name"]] = np.zeros(
            batch + [rows] + [max(d, 0) for d in dims[1:]], dtype=numpy_dtype
        )
    return arrays


def stub_answered(error_message: str | None) -> bool:
    """Whether the answer to a probe came from a running stub: any answer but the python
    backend's own refusal of a request to a stub that is gone."""
    return error_message is None or "is not healthy" not in error_message
