"""What is true of each served model: loaded, its python-backend stubs alive, requests failing, why.

Triton keeps answering READY, to its readiness endpoints and its repository index, for a python
model whose stub process died: every request then fails with "Stub process ... is not healthy",
forever, and nothing is logged. The launcher owns tritonserver, so it can see the stubs (children
of tritonserver, one per model instance) in /proc and compare them with the instances each
model's config asks for. A stub that is a zombie or stopped, or missing, makes its model
unhealthy; how it ended (killed by SIGKILL, exited with code 1) becomes the model's last error.
This module holds those facts and the rules that turn them into a ``ModelHealth`` per model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

import numpy as np

from merlin_torch_serving import wire
from merlin_torch_serving.process import ProcessInfo, describe_exit

STUB_NAME = "triton_python_backend_stub"


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
    #: how many times the launcher reloaded it because it had failed
    restarts: int = 0

    @property
    def healthy(self) -> bool:
        return self.state == "READY" and self.stubs_alive is not False


@dataclass(frozen=True)
class Stub:
    """A python-backend stub process: the model instance it runs, and whether it still runs."""

    pid: int
    model: str
    version: int
    instance: str
    alive: bool


def stub_of(process: ProcessInfo) -> Stub | None:
    """The stub a process of tritonserver is, read from its command line (``stub model.py ...``)."""
    if len(process.argv) < 2 or not process.argv[0].endswith(STUB_NAME):
        return None
    model_file = PurePath(process.argv[1])  # <repository>/<model>/<version>/model.py
    model, version = model_file.parent.parent.name, model_file.parent.name
    if not version.isdigit():
        return None
    instance = next((arg for arg in process.argv[2:] if arg.startswith(f"{model}_")), model)
    return Stub(process.pid, model, int(version), instance, process.is_alive)


class StubRecord:
    """The stubs seen so far, so that one that died (a zombie has no command line) is still known."""

    def __init__(self):
        self._known: dict[int, Stub] = {}

    def update(
        self, children: Iterable[ProcessInfo]
    ) -> tuple[dict[tuple[str, int], set[int]], dict[tuple[str, int], list[str]]]:
        """From tritonserver's children: the pids of live stubs per (model, version), and how
        dead ones ended."""
        live: dict[tuple[str, int], set[int]] = {}
        deaths: dict[tuple[str, int], list[str]] = {}
        present = set()
        for process in children:
            present.add(process.pid)
            stub = stub_of(process) if process.argv else None
            if stub is not None:
                self._known[process.pid] = stub
            stub = self._known.get(process.pid)
            if stub is None:
                continue
            key = (stub.model, stub.version)
            if process.is_alive:
                live.setdefault(key, set()).add(process.pid)
                continue
            how = describe_exit(process.exit_status) if process.state in ("Z", "X") else "stopped"
            deaths.setdefault(key, []).append(f"the stub of instance {stub.instance!r} (pid {stub.pid}) {how}")
        for pid in set(self._known) - present:
            del self._known[pid]  # reaped: it ended the normal way (unload)
        return live, deaths


def assess(
    statuses: Iterable[ModelStatus],
    instances: Mapping[tuple[str, int], int],
    live: Mapping[tuple[str, int], set[int]],
    deaths: Mapping[tuple[str, int], list[str]],
    failures: Mapping[tuple[str, int], int],
    notes: Mapping[str, str] = {},
    restarts: Mapping[str, int] = {},
    reloading: Iterable[str] = (),
) -> list[ModelHealth]:
    """One ``ModelHealth`` per index row.

    ``instances`` maps each python model version to the stub count its config asks for (models
    missing from it have no stubs); ``live`` and ``deaths`` come from ``StubRecord.update``;
    ``failures`` from the server's statistics; ``notes`` is the launcher's own last word on a
    model (a failed restart), shown when nothing worse is known. A model in ``reloading`` is
    being reloaded after its stubs died: its new stubs may run, but requests still reach the
    dead ones until the reload is done.
    """
    reloading = set(reloading)
    report = []
    for status in statuses:
        key = (status.name, status.version or 0)
        stubs_alive = None
        error = ""
        if status.state != "READY":
            error = status.reason
        elif status.name in reloading:
            stubs_alive = False
        elif key in instances:
            running = len(live.get(key, ()))
            stubs_alive = running >= instances[key]
            if not stubs_alive:
                missing = instances[key] - running
                error = "; ".join(deaths.get(key, [])) or f"{missing} of its {instances[key]} stub process(es) are gone"
                error += "; every request to it fails until it is reloaded"
        report.append(
            ModelHealth(
                name=status.name,
                version=status.version,
                state=status.state,
                stubs_alive=stubs_alive,
                failed_requests=failures.get(key),
                last_error=error or notes.get(status.name, ""),
                restarts=restarts.get(status.name, 0),
            )
        )
    return report


def expected_stubs(config: Mapping) -> int | None:
    """How many stub processes a model config asks for: one per instance of a python model;
    None for models that run without stubs."""
    if config.get("backend") != "python":
        return None
    return sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1


def probe_request(config: Mapping) -> dict[str, np.ndarray] | None:
    """A request of no rows for a python model, from its config: it reaches the model's stub
    (the answer to it says whether the stub runs) and costs nothing. None for models it does not
    fit: those without stubs, and those Triton batches (a batch of 0 rows is refused before it
    reaches the stub, so its answer would prove nothing)."""
    if expected_stubs(config) is None or int(config.get("max_batch_size", 0)) > 0:
        return None
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
        arrays[tensor["name"]] = np.zeros([rows] + [max(d, 0) for d in dims[1:]], dtype=numpy_dtype)
    return arrays


def stub_answered(error_message: str | None) -> bool:
    """Whether the answer to a probe came from a running stub: any answer but the python
    backend's own refusal of a request to a stub that is gone."""
    return error_message is None or "is not healthy" not in error_message
