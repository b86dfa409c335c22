"""The settings a step takes from ``config_overrides.json`` in its model folder instead of its
exported config (``export.config.CONFIG_OVERRIDES_FILE``: a route's weights), read as the step
loads and as ``routing.set_weights`` rewrites them."""

from __future__ import annotations

import json
import os

from merlin_torch_serving.exceptions import ArtifactError
from merlin_torch_serving.export.config import CONFIG_OVERRIDES_FILE


def read_config_overrides(model_dir: str | os.PathLike, step: str) -> dict:
    """The settings ``CONFIG_OVERRIDES_FILE`` in step ``step``'s folder holds ({} without one);
    ``ArtifactError`` naming the file when it holds no JSON object of objects."""
    path = os.path.join(model_dir, CONFIG_OVERRIDES_FILE)
    try:
        with open(path) as file:
            text = file.read()
    except FileNotFoundError:
        return {}
    hint = "fix the file or remove it (routing.set_weights writes it whole)"
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        raise ArtifactError(step, f"its {path!r} is not valid JSON ({error})", hint) from None
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        raise ArtifactError(
            step,
            f"its {path!r} holds {text.strip()[:80]!r}, where an object of call index -> settings"
            " was expected",
            hint,
        )
    return overrides
