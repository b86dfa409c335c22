"""The python-backend stubs of a tritonserver this process owns, read from /proc, and the rules
that turn them into a ``ModelHealth`` per model.

The stubs are children of tritonserver, one per model instance; they are compared with the
instances each model's config asks for. A stub that is a zombie or stopped, or missing, makes its
model unhealthy; how it ended (killed by SIGKILL, exited with code 1) becomes the model's last
error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

from merlin_torch_serving.backends.layout import STUB_NAME
from merlin_torch_serving.client.health import ModelHealth, ModelStatus, standby_error
from merlin_torch_serving.launcher.process import ProcessInfo, describe_exit


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
    """The stubs seen so far, so that one that died is still known.

    A zombie has no command line to tell what it was.
    """

    def __init__(self):
        self._known: dict[int, Stub] = {}

    def update(
        self, children: Iterable[ProcessInfo]
    ) -> tuple[dict[tuple[str, int], set[int]], dict[tuple[str, int], list[str]]]:
        """The live and the dead stubs among tritonserver's children.

        Returns the pids of live stubs per (model, version), and how dead ones ended.
        """
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
            deaths.setdefault(key, []).append(
                f"the stub of instance {stub.instance!r} (pid {stub.pid}) {how}"
            )
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
    standbys: Mapping[str, str] = {},
) -> list[ModelHealth]:
    """One ``ModelHealth`` per index row.

    ``instances`` maps each python model version to the stub count its config asks for (models
    missing from it have no stubs); ``live`` and ``deaths`` come from ``StubRecord.update``;
    ``failures`` from the server's statistics; ``notes`` is the launcher's own last word on a
    model (a failed restart), shown when nothing worse is known. A model in ``reloading`` is
    being reloaded after its stubs died: its new stubs may run, but requests still reach the
    dead ones until the reload is done. ``standbys`` maps each model whose ensembles run its
    standby (``launcher.failover``) to that standby: such a model is not healthy.
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
                error = (
                    "; ".join(deaths.get(key, []))
                    or f"{missing} of its {instances[key]} stub process(es) are gone"
                )
                error += "; every request to it fails until it is reloaded"
        standby = standbys.get(status.name, "") if status.state == "READY" else ""
        if standby and not error:
            error = standby_error(standby)
        report.append(
            ModelHealth(
                name=status.name,
                version=status.version,
                state=status.state,
                stubs_alive=stubs_alive,
                failed_requests=failures.get(key),
                last_error=error or notes.get(status.name, ""),
                restarts=restarts.get(status.name, 0),
                standby=standby,
            )
        )
    return report
