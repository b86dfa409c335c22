"""Python steps whose stub dies fail only the requests that were inside it.

Triton's python backend never restarts a dead stub, and Triton keeps handing the dead instance
requests, each failing after about a second: with one instance per step, every request fails
until the model is reloaded (4 to 12 failed requests over 5 to 12 s for raw clients, measured),
and taking the instance out of the model in place does not help (Triton keeps scheduling it until
its finalization is over: 15 failed requests in 16 s, measured). What works is keeping requests
away from the dead instance, which the launcher does for every python model an ensemble runs:

- the model runs at least two instances (raised in place when its config asks for one), so the
  requests already queued for it when one stub dies are answered by the other;
- a standby, ``<model>-standby``: the same model with one instance, its folders linked from the
  repository (downloaded, from object storage) into a second repository of the server's own,
  loaded beside it and idle.

When a stub of the model dies, every ensemble that runs it is switched to the standby (an
ensemble loads in milliseconds: it has no stubs of its own), the model is reloaded, and the
ensembles go back to it once it answers. Measured under 8 raw gRPC clients: one failed request,
the one the dead stub was running. The cost is two more stubs per python step (one instance, one
standby), each about what the step's stub takes on its own.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from google.protobuf import json_format, text_format

from merlin_torch_serving.client.health import ModelHealth, ModelStatus, expected_stubs
from merlin_torch_serving.deployment.locations import download_model_folder
from merlin_torch_serving.exceptions import MerlinTorchServingError

logger = logging.getLogger("merlin_torch_serving")

STANDBY_SUFFIX = "-standby"
#: instances a python model runs at least, so one survives the death of the other
MIN_INSTANCES = 2
#: how long switching an ensemble may take (it has no stubs: milliseconds)
SWITCH_TIMEOUT_S = 10.0


def standby_name(model: str) -> str:
    return model + STANDBY_SUFFIX


def is_standby(model: str) -> bool:
    return model.endswith(STANDBY_SUFFIX)


def with_instances(config: Mapping, count: int) -> dict:
    """``config`` with ``count`` instances in its first instance group (the others dropped)."""
    changed = copy.deepcopy(dict(config))
    groups = changed.get("instance_group") or [{"kind": "KIND_CPU"}]
    changed["instance_group"] = [{**groups[0], "count": count}]
    return changed


def switched_steps(config: Mapping, model: str, replacement: str) -> dict | None:
    """An ensemble's ``config`` with its steps that run ``model`` running ``replacement``; None if
    it has none."""
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    if not any(step.get("model_name") == model for step in steps):
        return None
    changed = copy.deepcopy(dict(config))
    for step in changed["ensemble_scheduling"]["step"]:
        if step.get("model_name") == model:
            step["model_name"] = replacement
    return changed


def write_standby(
    repository: Path | str, side_repository: Path, model: str, config: Mapping
) -> Path:
    """The standby's folder in ``side_repository``: its config (one instance, its own name) and
    every other entry of the model's folder (version folders, warm-up data), linked from a local
    repository or downloaded from one in object storage."""
    from tritonclient.grpc import model_config_pb2

    folder = side_repository / standby_name(model)
    if isinstance(repository, Path):
        folder.mkdir(parents=True, exist_ok=True)
        for entry in (repository / model).iterdir():
            link = folder / entry.name
            if entry.name != "config.pbtxt" and not link.exists():
                os.symlink(entry.resolve(), link)
    elif not folder.exists():
        download_model_folder(repository, model, folder)
    standby = {**with_instances(config, 1), "name": standby_name(model)}
    message = json_format.ParseDict(
        standby, model_config_pb2.ModelConfig(), ignore_unknown_fields=True
    )
    (folder / "config.pbtxt").write_text(text_format.MessageToString(message))
    return folder


def _basis(config: Mapping) -> dict:
    """What a standby copies of its model's config: all but its name and instances."""
    return {key: value for key, value in config.items() if key not in ("name", "instance_group")}


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
        #: python model -> the config its standby was made from (see ``_basis``)
        self._standbys: dict[str, dict] = {}
        #: ensembles seen, and models looked at that run no stub or could not be given a standby
        self._ensembles: set[str] = set()
        self._unarmed: set[str] = set()
        #: python model -> {ensemble: its config before the switch}
        self._switched: dict[str, dict[str, dict]] = {}

    # ---- arming ------------------------------------------------------------------------------

    def armed(self) -> set[str]:
        """The python models with a standby."""
        with self._lock:
            return set(self._standbys)

    def pending(self, statuses: Iterable[ModelStatus | ModelHealth]) -> list[str]:
        """READY models not yet looked at (each is armed if it is a python model)."""
        with self._lock:
            seen = set(self._standbys) | self._ensembles | self._unarmed
        return [
            status.name
            for status in statuses
            if status.state == "READY" and not is_standby(status.name) and status.name not in seen
        ]

    def arm(self, models: Iterable[str]) -> None:
        """Give each python model among ``models`` its second instance and its standby; note the
        ensembles."""
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
                self.ensure(model, config)

    def ensure(self, model: str, config: dict | None = None) -> None:
        """Keep ``model`` armed as it runs now: two instances at least (raised in place after a
        reload from its config.pbtxt), and a standby of its current config (made anew when the
        model was exported anew)."""
        config = config or self._config(model)
        if config is None:
            return
        try:
            if (expected_stubs(config) or 1) < MIN_INSTANCES:
                raised = with_instances(config, MIN_INSTANCES)
                self._admin.load(model, self._load_timeout_s, config=json.dumps(raised))
            with self._lock:
                current = self._standbys.get(model)
            if current != _basis(config):
                write_standby(self._repository, self._side, model, config)
                self._admin.load(standby_name(model), self._load_timeout_s)
                with self._lock:
                    armed_before = current is not None
                    self._standbys[model] = _basis(config)
                if not armed_before:
                    logger.info(
                        "model %r runs %d instances and a standby, %r: a stub that dies fails"
                        " only the requests inside it",
                        model,
                        max(MIN_INSTANCES, expected_stubs(config) or 1),
                        standby_name(model),
                    )
        except (MerlinTorchServingError, OSError, TimeoutError) as error:
            logger.warning("model %r runs without a standby: %s", model, error)
            with self._lock:
                self._standbys.pop(model, None)
                self._unarmed.add(model)

    def forget(self, models: Iterable[str]) -> None:
        """Drop what is known of ``models`` (unloaded), unloading their standbys."""
        for model in models:
            with self._lock:
                armed = self._standbys.pop(model, None) is not None
                self._ensembles.discard(model)
                self._unarmed.discard(model)
            if armed:
                try:
                    self._admin.unload(standby_name(model), self._load_timeout_s)
                except (MerlinTorchServingError, TimeoutError) as error:
                    logger.warning("could not unload %r: %s", standby_name(model), error)

    # ---- switching ---------------------------------------------------------------------------

    def switch_to_standby(self, model: str, because: str = "a stub of it died") -> list[str]:
        """Run every ensemble that runs ``model`` on its standby instead; the ensembles switched.
        ``because`` says why, for the log."""
        with self._lock:
            if model not in self._standbys or model in self._switched:
                return []
            before: dict[str, dict] = {}
            for ensemble in sorted(self._ensembles):
                config = self._config(ensemble)
                changed = switched_steps(config or {}, model, standby_name(model))
                if config is None or changed is None:
                    continue
                try:
                    self._admin.load(ensemble, SWITCH_TIMEOUT_S, config=json.dumps(changed))
                except (MerlinTorchServingError, TimeoutError) as error:
                    logger.error("could not switch ensemble %r to %r: %s", ensemble, model, error)
                    continue
                before[ensemble] = config
            self._switched[model] = before
        if before:
            logger.warning(
                "model %r: %s; ensemble(s) %s run its standby %r until it is reloaded",
                model,
                because,
                ", ".join(map(repr, before)),
                standby_name(model),
            )
        return list(before)

    def switch_back(self, model: str) -> None:
        """Run the ensembles switched away from ``model`` on it again (once it answers)."""
        with self._lock:
            before = self._switched.pop(model, {})
            for ensemble, config in before.items():
                try:
                    # given again: a load without a config keeps the switched one (the files of
                    # the ensemble did not change)
                    self._admin.load(ensemble, SWITCH_TIMEOUT_S, config=json.dumps(config))
                except (MerlinTorchServingError, TimeoutError) as error:
                    logger.error(
                        "could not switch ensemble %r back to %r: %s", ensemble, model, error
                    )
        if before:
            logger.warning(
                "model %r answers again: ensemble(s) %s run it again",
                model,
                ", ".join(map(repr, before)),
            )

    def recycle(self, model: str) -> bool:
        """Start ``model`` afresh without ever holding it twice: its ensembles run the standby
        while it is unloaded and loaded again. False (nothing done) if it has no standby."""
        if not self.switch_to_standby(model, because="it is started afresh"):
            return False
        try:
            self._admin.unload(model, self._load_timeout_s)
            self._wait_until_unloaded(model)
            self._admin.load(model, self._load_timeout_s)
            self.ensure(model)
        finally:
            self.switch_back(model)
        return True

    def is_switched(self, model: str) -> bool:
        with self._lock:
            return model in self._switched

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
