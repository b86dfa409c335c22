"""Watching a running tritonserver: each model's health on demand, and a thread that looks every
second, logs what failed and, when asked to, reloads a model whose stubs died.

The thread never restarts a model that is loading, unloading or was unloaded: only a model the
server still calls READY while its stubs are gone, which fails every request. A reload that
fails is tried again later, waiting twice as long each time (up to a minute), so a model that
cannot load does not keep the machine busy. With failover (``launcher.failover``) the thread also
gives python models their standbys and switches ensembles back to a model that answers again,
and a second thread (``launcher.deaths``) switches ensembles to a standby the moment a stub dies;
with a memory growth limit (``launcher.recycling``) it reloads python models whose stubs kept
memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

from merlin_torch_serving.client.health import ModelHealth, expected_stubs, failed_requests
from merlin_torch_serving.exceptions import MerlinTorchServingError, ServerError
from merlin_torch_serving.launcher import recycling
from merlin_torch_serving.launcher.deaths import DeathWatch
from merlin_torch_serving.launcher.failover import Failover
from merlin_torch_serving.launcher.process import children_of
from merlin_torch_serving.launcher.stubs import Stub, StubRecord, assess, stub_of

logger = logging.getLogger("merlin_torch_serving")

FIRST_RETRY_S = 1.0
LAST_RETRY_S = 60.0
#: the longest stop() waits for the thread (it may be inside a load, which fails once the server
#: is gone)
JOIN_TIMEOUT_S = 1.0


class Supervisor:
    """Health and self-repair of the models of one running ``TritonServer``.

    ``server`` is the facade: it gives ``pid``, ``is_running``, ``models()`` and ``reload(name)``;
    ``admin`` reads the models' configs and statistics.
    """

    def __init__(
        self,
        server,
        admin,
        *,
        restart_failed_models: bool,
        failover: Failover | None = None,
        memory_growth_limit: float | None = None,
        interval_s: float = 1.0,
    ):
        self._server = server
        self._admin = admin
        self._restart = restart_failed_models
        self._failover = failover
        self._memory = recycling.MemoryWatch(memory_growth_limit) if memory_growth_limit else None
        self._live: dict[tuple[str, int], set[int]] = {}
        #: stubs of retired versions still running -> their CPU ticks at the last look
        self._leftovers: dict[int, int] = {}
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._deaths = DeathWatch(server.pid, self._stub_died) if failover else None
        self._lock = threading.Lock()
        self._stubs = StubRecord()
        #: (model, version) -> (its stub pids, the stubs its config asks for, whether an ensemble)
        self._instances: dict[tuple[str, int], tuple[frozenset[int], int | None, bool]] = {}
        self._saw_death = False
        #: when the last report was taken (time.monotonic())
        self._seen_at = 0.0
        self._notes: dict[str, str] = {}
        self._restarts: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._retry_wait_s: dict[str, float] = {}
        self._reported: set[tuple[str, str]] = set()
        self._reloading: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # know the stubs from the start: one that dies before the first look is still named
        with self._lock:
            self._stubs.update(children_of(self._server.pid))
        self._thread = threading.Thread(
            target=self._watch, name=f"tritonserver-{self._server.pid}-supervisor", daemon=True
        )
        self._thread.start()
        if self._deaths is not None:
            self._deaths.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        if self._failover is not None:
            self._failover.close()
        if self._deaths is not None:
            self._deaths.stop(min(timeout_s, JOIN_TIMEOUT_S))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(min(timeout_s, JOIN_TIMEOUT_S))

    @property
    def saw_death(self) -> bool:
        """Whether a python-backend stub died while the server ran: tritonserver never unloads
        the model version that stub served, nor lets a graceful stop end before its exit timeout."""
        return self._saw_death

    def unloading(self) -> list[str] | None:
        """The models a graceful stop of the server will unload: the READY ones whose stubs all
        run (a version whose stub died never unloads); None when it cannot be told."""
        try:
            report = self.health()
        except MerlinTorchServingError:
            return None
        return [m.name for m in report if m.state == "READY" and m.stubs_alive is not False]

    def load_config(self, model: str) -> str | None:
        """The config (JSON) a reload of ``model`` should load it with (``Failover.load_config``),
        None for its config.pbtxt as it is."""
        return self._failover.load_config(model) if self._failover is not None else None

    def pending(self, statuses) -> list[str]:
        """READY models failover has not looked at yet."""
        return self._failover.pending(statuses) if self._failover is not None else []

    def armed(self) -> set[str]:
        """The python models with a standby ready (see ``launcher.failover``)."""
        return self._failover.armed() if self._failover is not None else set()

    def health(self) -> list[ModelHealth]:
        """One ``ModelHealth`` per model of the repository index."""
        with self._lock:
            statuses = self._server.models()
            self._seen_at = time.monotonic()
            live, deaths = self._stubs.update(children_of(self._server.pid))
            self._live = live
            instances, ensembles = {}, set()
            for status in statuses:
                key = (status.name, status.version or 0)
                if status.state == "READY":
                    expected, ensemble = self._config_facts(key, frozenset(live.get(key, ())))
                    if expected is not None:
                        instances[key] = expected
                    if ensemble:
                        ensembles.add(status.name)
            try:
                failures = failed_requests(self._admin.statistics(), ensembles)
            except ServerError:
                failures = {}
            return assess(
                statuses,
                instances,
                live,
                deaths,
                failures,
                self._notes,
                self._restarts,
                self._reloading,
                self._failover.switched() if self._failover is not None else {},
            )

    def _config_facts(self, key: tuple[str, int], pids: frozenset[int]) -> tuple[int | None, bool]:
        """The stubs a model version's config asks for, and whether it is an ensemble; read again
        whenever its stubs change, so a reload with another instance count is seen."""
        cached = self._instances.get(key)
        if cached is None or cached[0] != pids:
            try:
                config = self._admin.model_config(*key)
            except ServerError:
                return (cached[1], cached[2]) if cached else (None, False)
            config = config.get("config", config)
            self._instances[key] = (
                pids,
                expected_stubs(config),
                config.get("platform") == "ensemble",
            )
        return self._instances[key][1], self._instances[key][2]

    # ---- the thread -------------------------------------------------------------------------

    def _stub_died(self, stub: Stub) -> None:
        """At once, from the death watch: keep requests away from the dead stub's model, if its
        standby's stub runs."""
        self._saw_death = True
        if self._failover is not None and not self._stop.is_set():
            standby = self._failover.standby_of(stub.model)
            if standby is not None and self._runs(standby):
                self._failover.switch_to_standby(stub.model)
        self._wake.set()  # repair it now rather than at the next look

    def _runs(self, model: str) -> bool:
        """Whether a live stub of ``model`` runs now."""
        stubs = (stub_of(process) for process in children_of(self._server.pid) if process.argv)
        return any(stub is not None and stub.model == model and stub.alive for stub in stubs)

    def _watch(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self._server.is_running:
                logger.error(
                    "tritonserver (pid %s) exited on its own; its models no longer answer",
                    self._server.pid,
                )
                return
            try:
                report = self.health()
            except MerlinTorchServingError:
                continue  # the server may be stopping; is_running says so next time
            for model in report:
                if model.state == "READY" and model.stubs_alive is False:
                    self._handle_failure(model)
            self._keep_memory(report)
            self._keep_standbys(report)
            self._reap_leftovers()

    def _reap_leftovers(self) -> None:
        """End the stubs of a retired version that tritonserver keeps (see _handle_failure) once
        they have done no work for a look: they answer nothing any more, and each holds what a
        stub holds."""
        for pid, ticks in list(self._leftovers.items()):
            now = recycling.cpu_ticks(pid)
            if now == 0:
                del self._leftovers[pid]  # gone
            elif now != ticks:
                self._leftovers[pid] = now  # finishing the requests it had
            else:
                del self._leftovers[pid]
                if self._deaths is not None:
                    self._deaths.ignore(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                logger.info("ended stub %d of a version tritonserver retired but kept", pid)

    def _keep_standbys(self, report: list[ModelHealth]) -> None:
        """Arm new python models; keep armed ones so (reloaded, exported anew); drop unloaded; end
        the switches of models that answer again."""
        if self._failover is None or self._stop.is_set():
            return
        self._failover.forget(model.name for model in report if model.state == "UNAVAILABLE")
        stubs: dict[str, frozenset[int]] = {}
        for (name, _), pids in self._live.items():
            stubs[name] = stubs.get(name, frozenset()) | (pids - set(self._leftovers))
        self._failover.arm(self._failover.pending(report), stubs)
        answering = {
            model.name
            for model in report
            if model.state == "READY" and model.stubs_alive and model.name not in self._reloading
        }
        for name in sorted(self._failover.armed() & answering):
            if not self._failover.is_switched(name) and not self._stop.is_set():
                self._failover.ensure(name, stubs=stubs.get(name, frozenset()))
        self._failover.settle(answering, self._seen_at)

    def _keep_memory(self, report: list[ModelHealth]) -> None:
        """Reload the python models whose stubs kept memory (``launcher.recycling``)."""
        if self._memory is None:
            return
        for model in report:
            if model.state != "READY" or model.stubs_alive is not True or self._stop.is_set():
                continue
            pids = frozenset(self._live.get((model.name, model.version or 0), ()))
            held = sum(recycling.resident_bytes(pid) for pid in pids)
            ticks = sum(recycling.cpu_ticks(pid) for pid in pids)
            reason = self._memory.observe(model.name, pids, held, ticks, time.monotonic())
            if reason is None:
                continue
            logger.warning("model %r: %s; reloading it to give the memory back", model.name, reason)
            try:
                # with a standby, the model is unloaded before it is loaded again, so memory never
                # holds it twice; else a reload starts new stubs beside the old ones
                if self._failover is None or not self._failover.recycle(model.name):
                    self._server.reload(model.name)
            except (MerlinTorchServingError, TimeoutError) as error:
                logger.error("reloading model %r to give memory back failed: %s", model.name, error)
            self._memory.reloaded(model.name, time.monotonic())

    def _handle_failure(self, model: ModelHealth) -> None:
        self._saw_death = True
        if self._failover is not None and not self._stop.is_set():
            # before any reload: loading the model holds its ensembles until it is loaded
            self._failover.switch_to_standby(model.name)
        if (model.name, model.last_error) not in self._reported:
            self._reported.add((model.name, model.last_error))
            logger.warning(
                "model %r (version %s) fails every request: %s%s",
                model.name,
                model.version,
                model.last_error,
                "; reloading it"
                if self._restart
                else "; reload it, or start the server with restart_failed_models=True",
            )
        if (
            not self._restart
            or time.monotonic() < self._retry_at.get(model.name, 0.0)
            or self._stop.is_set()
        ):
            return
        self._notes[model.name] = f"being reloaded after: {model.last_error}"
        self._reloading.add(model.name)
        # the model's stubs that still run: tritonserver 2.51 never finishes retiring a version
        # one of whose stubs died, so these would outlive the reload (see _reap_leftovers)
        survivors = set(self._live.get((model.name, model.version or 0), ()))
        try:
            self._server.reload(model.name)
        except MerlinTorchServingError as error:
            if self._stop.is_set():
                return  # the server is stopping: nothing to repair
            wait_s = min(self._retry_wait_s.get(model.name, FIRST_RETRY_S / 2) * 2, LAST_RETRY_S)
            self._retry_wait_s[model.name] = wait_s
            self._retry_at[model.name] = time.monotonic() + wait_s
            self._notes[model.name] = f"reloading it after its failure failed: {error}"
            logger.error(
                "reloading model %r failed (next try in %g s): %s", model.name, wait_s, error
            )
            return
        finally:
            self._reloading.discard(model.name)
        if self._failover is not None:
            # reloaded with its two instances (Failover.load_config): it takes the ensembles'
            # requests back
            self._failover.switch_back(model.name)
        self._leftovers.update(dict.fromkeys(survivors, -1))
        self._retry_wait_s.pop(model.name, None)
        self._retry_at.pop(model.name, None)
        self._restarts[model.name] = self._restarts.get(model.name, 0) + 1
        self._notes[model.name] = f"reloaded after: {model.last_error}"
        logger.warning(
            "model %r was reloaded and answers again (restart %d)",
            model.name,
            self._restarts[model.name],
        )
