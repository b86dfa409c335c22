"""A python model's standby: the same model under another name, in a folder of the server's second
repository that nothing but the launcher changes.

tritonserver reloads a model whose files changed (their modification or change time moved)
whenever a load touches it, and loading an ensemble touches every model it runs: had the
standby's folder been a link to the model's, the switch to it (an ensemble load, see
``launcher.failover``) would first reload the standby after every ``reload()`` of the model (which
touches the model's version folder) or new weights (a new ``config_overrides.json``), failing
requests for the seconds a stub takes to start. So the standby's folders are its own, each file a
symbolic link to the model's (no copy of the bytes; hard links would not do: making one changes
the file's change time, so the model would seem changed), the files the library rewrites
(``config_overrides.json``) copied, and its config its own. It changes only when the launcher
makes a new one, after the model was reloaded with other files (``fingerprint``); a new standby
gets a new name (``<model>-standby-<n>``), so the one in place stays ready while it loads. A new
export over the model changes the files the links point to: until the model is reloaded (and its
standby made anew), a switch first reloads the standby.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from google.protobuf import json_format, text_format

from merlin_torch_serving.client.health import STANDBY_NAME
from merlin_torch_serving.deployment.locations import download_model_folder

STANDBY_SUFFIX = "-standby"
CONFIG_FILE = "config.pbtxt"
#: the settings a step takes from its folder (``export.config.CONFIG_OVERRIDES_FILE``'s twin: the
#: launcher does not import the exporter)
OVERRIDES_FILE = "config_overrides.json"
#: files of a model folder the library replaces while the model serves: copied, never linked
_COPIED = frozenset({OVERRIDES_FILE})


def standby_name(model: str, generation: int = 0) -> str:
    """``<model>-standby``, then ``<model>-standby-<n>`` for the standbys made after it."""
    return f"{model}{STANDBY_SUFFIX}" + (f"-{generation}" if generation else "")


def is_standby(name: str) -> bool:
    return STANDBY_NAME.match(name) is not None


def model_of(name: str) -> str | None:
    """The model a standby stands in for; None when ``name`` is no standby."""
    match = STANDBY_NAME.match(name)
    return match.group(1) if match else None


def fingerprint(repository: Path | str, model: str) -> tuple:
    """What tells the files of ``model``'s folder apart from other files: each file's path, inode,
    size, modification and change time (its config.pbtxt aside: a standby has its own). Empty for
    a repository in object storage (its standby is downloaded once)."""
    if not isinstance(repository, Path):
        return ()
    root = repository / model
    found = []
    for folder, _, files in os.walk(root, followlinks=True):
        for name in files:
            path = Path(folder, name)
            relative = path.relative_to(root)
            if relative == Path(CONFIG_FILE):
                continue
            try:
                status = path.stat()
            except OSError:
                continue  # removed meanwhile: the next look sees the folder as it is then
            found.append(
                (
                    str(relative),
                    status.st_ino,
                    status.st_size,
                    status.st_mtime_ns,
                    status.st_ctime_ns,
                )
            )
    return tuple(sorted(found))


def write_standby(
    repository: Path | str, side_repository: Path, model: str, config: Mapping, name: str
) -> Path:
    """The standby ``name`` of ``model`` in ``side_repository``: a copy of the model's folder (see
    the module's docstring; downloaded from a repository in object storage) with ``config`` under
    its own name."""
    from tritonclient.grpc import model_config_pb2

    folder = side_repository / name
    shutil.rmtree(folder, ignore_errors=True)
    if isinstance(repository, Path):
        _copy_tree(repository / model, folder)
    else:
        download_model_folder(repository, model, folder)
    message = json_format.ParseDict(
        {**config, "name": name}, model_config_pb2.ModelConfig(), ignore_unknown_fields=True
    )
    (folder / CONFIG_FILE).write_text(text_format.MessageToString(message))
    return folder


def remove_standby(side_repository: Path, name: str) -> None:
    shutil.rmtree(side_repository / name, ignore_errors=True)


def _copy_tree(source: Path, target: Path) -> None:
    for folder, _, files in os.walk(source, followlinks=True):
        here = target / Path(folder).relative_to(source)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            if Path(folder) == source and name == CONFIG_FILE:
                continue
            original = Path(folder, name)
            if name in _COPIED:
                shutil.copyfile(original, here / name)
            else:
                os.symlink(original.resolve(), here / name)
