"""Python steps whose stub dies fail only the requests that were inside it.

Triton's python backend never restarts a dead stub, and Triton keeps handing the dead instance
requests, each failing after about a second: with one instance per step, every request fails
until the model is reloaded (4 to 12 failed requests over 5 to 12 s for raw clients, measured),
and taking the instance out of the model in place does not help (Triton keeps scheduling it until
its finalization is over: 15 failed requests in 16 s, measured). What works is keeping requests
away from the dead instance, which the launcher does for every python model an ensemble runs:

- the model runs at least two instances (loaded so, or raised in place when it was loaded from a
  config that asks for one), so the requests already queued for it when one stub dies are
  answered by the other;
- a standby, ``<model>-standby``: the same model with one instance in a folder of its own
  (``launcher.standby``), loaded beside it and idle, made anew when the model is reloaded with
  other files (new weights, a new export).

When a stub of the model dies, every ensemble that runs it is switched to the standby (an
ensemble loads in milliseconds: it has no stubs of its own, and the standby it now runs is loaded
and unchanged), the model is reloaded, and the ensembles go back to it once it answers. A switch
always ends: every second the supervisor switches back the ensembles that run the standby of a
model that answers again, whoever repaired it (itself, or a ``reload()``) and whatever became of
the call that switched them (tritonserver finishes a load whose call timed out); until then the
model's ``health()`` names its standby and calls it unhealthy. Measured under 8 raw gRPC clients:
one failed request per kill, the one the dead stub was running. The cost is two more stubs per
python step (one instance, one standby), each about what the step's stub takes on its own.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from merlin_torch_serving.client.health import ModelHealth, ModelStatus, expected_stubs
from merlin_torch_serving.exceptions import MerlinTorchServingError
from merlin_torch_serving.launcher import standby as standbys
from merlin_torch_serving.launcher.admin import Refused
from merlin_torch_serving.launcher.running import model_config_file

logger = logging.getLogger("merlin_torch_serving")

#: instances a python model runs at least, so one survives the death of the other
MIN_INSTANCES = 2
#: how long switching an ensemble may take (it has no stubs, nothing it runs loads: milliseconds)
SWITCH_TIMEOUT_S = 10.0
#: what a failed admin call raises
_FAILED_CALL = (MerlinTorchServingError, Refused, OSError, TimeoutError)


def with_instances(config: Mapping, count: int) -> dict:
    """``config`` with ``count`` instances in its first instance group (the others dropped)."""
    changed = copy.deepcopy(dict(config))
    groups = changed.get("instance_group") or [{"kind": "KIND_CPU"}]
    changed["instance_group"] = [{**groups[0], "count": count}]
    return changed


def with_steps_renamed(config: Mapping, renamed: Mapping[str, str]) -> dict | None:
    """An ensemble's ``config`` with each step that runs a model of ``renamed`` running its new
    name instead; None if no step runs one."""
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    if not any(step.get("model_name") in renamed for step in steps):
        return None
    changed = copy.deepcopy(dict(config))
    for step in changed["ensemble_scheduling"]["step"]:
        step["model_name"] = renamed.get(step.get("model_name"), step.get("model_name"))
    return changed


def standby_steps(config: Mapping) -> dict[str, str]:
    """The standbys an ensemble's ``config`` runs, each with the model it stands in for."""
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    found = {
        step.get("model_name", ""): standbys.model_of(step.get("model_name", "")) for step in steps
    }
    return {name: model for name, model in found.items() if model is not None}


def _basis(config: Mapping) -> dict:
    """What a standby copies of its model's config: all but its name and instances."""
    return {key: value for key, value in config.items() if key not in ("name", "instance_group")}


@dataclass(frozen=True)
class _Standby:
    """The standby loaded for a model, and what it is a copy of."""

    name: str
    generation: int
    #: the model's config it was made from (``_basis``) and the files (``standby.fingerprint``)
    basis: dict
    files: tuple
    #: the model's stubs that ran it as the standby has it (a reload replaces them all)
    stubs: frozenset[int]


class Failover:
    """The standbys and switches of one running server (see the module's docstring).

    ``admin`` is the server's ``launcher.admin.Admin``; ``repository`` its model repository (a
    local folder or an object-store URL) and ``side_repository`` the second one the server was
    started with, for the standbys. Configs are always read from the server as they are now, so a
    model exported anew and reloaded gets a standby of what it became.
    """

    def __init__(self, admin, repository: Path | str, side_repository: Path, load_timeout_s: float):
        self._admin = admin
        self._repository = repository
        self._side = side_repository
        self._load_timeout_s = load_timeout_s
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._standbys: dict[str, _Standby] = {}
        #: ensembles seen, and models looked at that run no stub or could not be given a standby
        self._ensembles: set[str] = set()
        self._unarmed: set[str] = set()
        #: python model -> (why its ensembles run its standby, since when: time.monotonic())
        self._switched: dict[str, tuple[str, float]] = {}
        #: standbys made obsolete by a newer one, unloaded once no ensemble runs them
        self._retired: set[str] = set()

    def close(self) -> None:
        """Do nothing more: the server is stopping."""
        self._closed.set()

    # ---- arming ------------------------------------------------------------------------------

    def armed(self) -> set[str]:
        """The python models with a standby."""
        with self._lock:
            return set(self._standbys)

    def standby_of(self, model: str) -> str | None:
        """The name of ``model``'s standby now; None without one."""
        with self._lock:
            current = self._standbys.get(model)
        return current.name if current else None

    def pending(self, statuses: Iterable[ModelStatus | ModelHealth]) -> list[str]:
        """READY models not yet looked at (each is armed if it is a python model)."""
        with self._lock:
            seen = set(self._standbys) | self._ensembles | self._unarmed
        return [
            status.name
            for status in statuses
            if status.state == "READY"
            and not standbys.is_standby(status.name)
            and status.name not in seen
        ]

    def arm(self, models: Iterable[str], stubs: Mapping[str, frozenset[int]] = {}) -> None:
        """Give each python model among ``models`` its second instance and its standby; note the
        ensembles. ``stubs``: each model's live stub pids."""
        for model in models:
            config = self._config(model)
            if config is None:
                continue  # unloaded meanwhile: looked at again if it comes back
            if config.get("platform") == "ensemble":
                with self._lock:
                    self._ensembles.add(model)
            elif expected_stubs(config) is None:
                with self._lock:
                    self._unarmed.add(model)  # no stubs (libtorch): nothing to protect
            else:
                self.ensure(model, config, stubs.get(model, frozenset()))

    def ensure(
        self, model: str, config: dict | None = None, stubs: frozenset[int] = frozenset()
    ) -> None:
        """Keep ``model`` armed as it runs now: two instances at least (raised in place after a
        load from a config.pbtxt that asks for one), and a standby of its current config and
        files: made anew once the model was reloaded (``stubs``, its live stub pids, are all new)
        with other files, or runs another config."""
        if self._closed.is_set():
            return
        config = config or self._config(model)
        if config is None:
            return
        try:
            if (expected_stubs(config) or 1) < MIN_INSTANCES:
                raised = with_instances(config, MIN_INSTANCES)
                self._admin.load(model, self._load_timeout_s, config=json.dumps(raised))
            with self._lock:
                current = self._standbys.get(model)
            basis, files = _basis(config), standbys.fingerprint(self._repository, model)
            if current is not None and current.basis == basis:
                if current.files == files:
                    if stubs and stubs != current.stubs:  # the model as the standby has it
                        with self._lock:
                            self._standbys[model] = replace(current, stubs=stubs)
                    return
                if not stubs or not stubs.isdisjoint(current.stubs):
                    return  # files changed, and the model still runs the old ones
            self._make_standby(model, current, config, basis, files, stubs)
        except _FAILED_CALL as error:
            if self._closed.is_set():
                return
            logger.warning("model %r runs without a standby: %s", model, error)
            with self._lock:
                if model not in self._standbys:
                    self._unarmed.add(model)

    def _make_standby(self, model, current, config, basis, files, stubs) -> None:
        """Load a new standby beside the one in place (if any), then retire that one: ensembles
        switched meanwhile run a standby that is loaded and unchanged."""
        generation = 0 if current is None else current.generation + 1
        name = standbys.standby_name(model, generation)
        standbys.write_standby(self._repository, self._side, model, with_instances(config, 1), name)
        self._admin.load(name, self._load_timeout_s)
        with self._lock:
            self._standbys[model] = _Standby(name, generation, basis, files, stubs)
            if current is not None:
                self._retired.add(current.name)
        if current is None:
            logger.info(
                "model %r runs %d instances and a standby, %r: a stub that dies fails only the"
                " requests inside it",
                model,
                max(MIN_INSTANCES, expected_stubs(config) or 1),
                name,
            )
        else:
            logger.info(
                "model %r was reloaded with other files: its standby is now %r", model, name
            )
        self._unload_retired()

    def load_config(self, model: str) -> str | None:
        """The config (JSON) to load ``model`` with: its repository's config.pbtxt with two
        instances when it has a standby and the file asks for fewer (so it never runs one between
        a reload and the next look); None to load it as the file says."""
        with self._lock:
            if model not in self._standbys:
                return None
        config = model_config_file(self._repository, model)
        if config is None or (expected_stubs(config) or 1) >= MIN_INSTANCES:
            return None
        return json.dumps(with_instances(config, MIN_INSTANCES))

    def forget(self, models: Iterable[str]) -> None:
        """Drop what is known of ``models`` (unloaded), unloading their standbys."""
        for model in models:
            with self._lock:
                current = self._standbys.pop(model, None)
                self._ensembles.discard(model)
                self._unarmed.discard(model)
                self._switched.pop(model, None)
            if current is not None:
                with self._lock:
                    self._retired.add(current.name)
        self._unload_retired()

    def _unload_retired(self) -> None:
        """Unload the standbys no longer in use that no ensemble runs."""
        with self._lock:
            retired = set(self._retired)
        if not retired or self._closed.is_set():
            return
        running = set()
        for ensemble in self._ensemble_names():
            running |= set(standby_steps(self._config(ensemble) or {}))
        for name in sorted(retired - running):
            try:
                self._admin.unload(name, self._load_timeout_s)
            except _FAILED_CALL as error:
                logger.warning("could not unload %r: %s", name, error)
                continue
            standbys.remove_standby(self._side, name)
            with self._lock:
                self._retired.discard(name)

    # ---- switching ---------------------------------------------------------------------------

    def switch_to_standby(self, model: str, because: str = "a stub of it died") -> list[str]:
        """Run every ensemble that runs ``model`` on its standby instead; the ensembles switched.
        ``because`` says why, for the log. The switch is recorded before it is asked for, so it
        ends (``settle``) even when the call fails or times out."""
        with self._lock:
            current = self._standbys.get(model)
            if current is None or model in self._switched or self._closed.is_set():
                return []
            changes = {}
            for ensemble in sorted(self._ensembles):
                changed = with_steps_renamed(self._config(ensemble) or {}, {model: current.name})
                if changed is not None:
                    changes[ensemble] = changed
            if not changes:
                return []
            self._switched[model] = (because, time.monotonic())
            switched = []
            for ensemble, changed in changes.items():
                try:
                    self._admin.load(ensemble, SWITCH_TIMEOUT_S, config=json.dumps(changed))
                except _FAILED_CALL as error:
                    logger.error(
                        "could not switch ensemble %r to %r: %s", ensemble, current.name, error
                    )
                    continue
                switched.append(ensemble)
        if switched:
            logger.warning(
                "model %r: %s; ensemble(s) %s run its standby %r until it answers again",
                model,
                because,
                ", ".join(map(repr, switched)),
                current.name,
            )
        return switched

    def switch_back(self, model: str) -> bool:
        """Run every ensemble that runs a standby of ``model`` on it again; whether all do now
        (the switch is then over)."""
        with self._lock:
            if self._closed.is_set():
                return False
            back, done = [], True
            for ensemble in sorted(self._ensembles):
                config = self._config(ensemble)
                renamed = {
                    name: model for name, of in standby_steps(config or {}).items() if of == model
                }
                changed = with_steps_renamed(config or {}, renamed)
                if changed is None:
                    done = done and config is not None
                    continue
                try:
                    self._admin.load(ensemble, SWITCH_TIMEOUT_S, config=json.dumps(changed))
                except _FAILED_CALL as error:
                    done = False
                    logger.error(
                        "could not switch ensemble %r back to %r: %s", ensemble, model, error
                    )
                    continue
                back.append(ensemble)
            if done:
                self._switched.pop(model, None)
        if back:
            logger.warning(
                "model %r answers again: ensemble(s) %s run it again",
                model,
                ", ".join(map(repr, back)),
            )
        if done:
            self._unload_retired()
        return done

    def settle(self, answering: Iterable[str], seen_at: float) -> None:
        """End the switches of the models in ``answering`` (python models whose stubs all ran at
        ``seen_at``, a ``time.monotonic()`` after the switch), and note the switches not recorded
        (an ensemble found running a standby)."""
        if self._closed.is_set():
            return
        for ensemble in self._ensemble_names():
            for model in standby_steps(self._config(ensemble) or {}).values():
                with self._lock:
                    self._switched.setdefault(
                        model, ("an ensemble was found running its standby", 0.0)
                    )
        answering = set(answering)
        for model, (_, since) in self.switched_since().items():
            if model in answering and seen_at > since:
                self.switch_back(model)
        self._unload_retired()

    def switched(self) -> dict[str, str]:
        """The models whose ensembles run their standby, with its name."""
        with self._lock:
            return {
                model: self._standbys[model].name if model in self._standbys else ""
                for model in self._switched
            }

    def switched_since(self) -> dict[str, tuple[str, float]]:
        with self._lock:
            return dict(self._switched)

    def is_switched(self, model: str) -> bool:
        with self._lock:
            return model in self._switched

    def recycle(self, model: str) -> bool:
        """Start ``model`` afresh without ever holding it twice: its ensembles run the standby
        while it is unloaded and loaded again. False (nothing done) if it has no standby."""
        if not self.switch_to_standby(model, because="it is started afresh"):
            return False
        try:
            self._admin.unload(model, self._load_timeout_s)
            self._wait_until_unloaded(model)
            self._admin.load(model, self._load_timeout_s, config=self.load_config(model))
        finally:
            self.switch_back(model)
        return True

    def _ensemble_names(self) -> list[str]:
        with self._lock:
            return sorted(self._ensembles)

    def _config(self, model: str) -> dict | None:
        try:
            config = self._admin.model_config(model)
        except MerlinTorchServingError:
            return None
        return config.get("config", config)

    def _wait_until_unloaded(self, model: str) -> None:
        """Unload returns before the model's stubs are gone: wait for them (in-flight requests
        finish first)."""
        deadline = time.monotonic() + self._load_timeout_s
        while any(m.name == model and m.state == "READY" for m in self._admin.models()):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"model {model!r} still READY after its unload was asked for")
            time.sleep(0.1)
