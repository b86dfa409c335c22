"""Changing an experiment's weights in an exported repository, without a new export.

The weights a route was exported with are in its step's ``step.json``, covered by the step's
digests; new ones go into ``config_overrides.json`` beside the step's ``config.pbtxt``, which the
step reads when it loads. So::

    step = set_weights("repository", "recs", {"current": 0.7, "candidate": 0.3})
    server.reload(step)  # the new instance loads beside the old one: no request fails

Only the sessions whose bucket lies between the old and the new cut points change variant.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.manifest import MANIFEST_FILE
from merlin_torch_serving.export.overrides import read_config_overrides
from merlin_torch_serving.export.python_model import STEP_FILE
from merlin_torch_serving.routing.experiment import checked_weights
from merlin_torch_serving.routing.route import Route

ROUTE_CLASS = f"{Route.__module__}.{Route.__qualname__}"


def set_weights(
    repository: str | os.PathLike,
    ensemble: str,
    weights: Mapping[str, float],
    *,
    experiment: str | None = None,
) -> str:
    """Write new ``weights`` (one per variant) for ``experiment`` (needed only when the ensemble
    has several) into the config of the step that routes it, and return that step's model name:
    reload it (``TritonServer.reload``) and the new weights take effect."""
    model, call, overrides = _experiment_step(Path(repository), ensemble, experiment)
    name = call["config"]["experiment"]["name"]
    checked = checked_weights(name, weights, list(call["config"]["weights"]))
    overrides.setdefault(str(call["index"]), {})["weights"] = checked
    path = Path(repository) / model / configs.CONFIG_OVERRIDES_FILE
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(json.dumps(overrides, indent=1) + "\n")
    # a loading step reads the old file or the new one; a standby's link to it follows
    os.replace(staged, path)
    return model


def weights_of(
    repository: str | os.PathLike, ensemble: str, *, experiment: str | None = None
) -> dict[str, float]:
    """The weights the step that routes ``experiment`` loads with (set, else exported)."""
    _, call, overrides = _experiment_step(Path(repository), ensemble, experiment)
    return dict(overrides.get(str(call["index"]), {}).get("weights", call["config"]["weights"]))


def _experiment_step(
    repository: Path, ensemble: str, experiment: str | None
) -> tuple[str, dict, dict]:
    """The step model routing ``experiment``, its route's call (from step.json) and the settings
    its ``config_overrides.json`` holds."""
    manifest_dirs = sorted(
        (p for p in (repository / ensemble).glob("*") if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    if not manifest_dirs or not (manifest_dirs[-1] / MANIFEST_FILE).is_file():
        raise ValueError(
            f"{str(repository / ensemble)!r} holds no export of ensemble {ensemble!r}; give the"
            " repository and the name it was exported with"
        )
    manifest = json.loads((manifest_dirs[-1] / MANIFEST_FILE).read_text())
    found = []
    for step in manifest.get("steps", []):
        if not any(op["class"] == ROUTE_CLASS for op in step.get("operators", [])):
            continue
        spec_path = repository / step["model"] / str(manifest["version"]) / STEP_FILE
        for call in json.loads(spec_path.read_text())["calls"]:
            routed = call["config"].get("experiment") if call["class"] == ROUTE_CLASS else None
            if routed and experiment in (None, routed["name"]):
                found.append((step["model"], call))
    if len(found) != 1:
        names = [call["config"]["experiment"]["name"] for _, call in found]
        wanted = f"experiment {experiment!r}" if experiment else "an experiment"
        raise ValueError(
            f"ensemble {ensemble!r} has {len(found)} route(s) with {wanted}"
            + (f" ({names}); name one with experiment=..." if found else "")
        )
    model, call = found[0]
    return model, call, read_config_overrides(repository / model, model)
