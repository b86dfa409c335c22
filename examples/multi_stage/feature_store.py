"""The example's Feast feature store: a feature repository written from DataFrames, ``feast apply``
and ``feast materialize`` into its sqlite online store, and ``feast serve`` as a child process.

Feast runs from its own environment (``.venv-feast``, made by ``./run setup``; ``MTS_FEAST_VENV``
points elsewhere): its commands are called as programs, never imported, as the serving step only
speaks to the feature server over HTTP. Offline throughout: the ``local`` provider, a parquet
``FileSource``, the ``sqlite`` online store, ``FEAST_USAGE=False``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
FEAST_VERSION = "0.49.0"
PROJECT = "multi_stage"
ITEM_VIEW, SESSION_VIEW = "item_features", "session_features"
#: the feature views' features as the serving step declares them (Feast's types in the comment)
ITEM_FEATURES = {
    "category": "int64",  # Int64
    "price_bucket": "int64",  # Int64
    "popularity": "float32",  # Float32
    "tags": "list[int64]",  # Array(Int64)
}
SESSION_FEATURES = {"device": "int64"}  # Int64

_STORE_YAML = f"""project: {PROJECT}
provider: local
registry: data/registry.db
online_store:
  type: sqlite
  path: data/online_store.db
offline_store:
  type: file
entity_key_serialization_version: 2
"""

# `feast apply` imports every .py file of the repository folder: this is the only one
_DEFINITIONS = f'''"""Feature definitions of the multi-stage example (feature_store.py)."""

from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource
from feast.types import Array, Float32, Int64

item = Entity(name="item_id", join_keys=["item_id"])
session = Entity(name="session_id", join_keys=["session_id"])

{ITEM_VIEW} = FeatureView(
    name="{ITEM_VIEW}",
    entities=[item],
    ttl=timedelta(days=36500),
    schema=[
        Field(name="category", dtype=Int64),
        Field(name="price_bucket", dtype=Int64),
        Field(name="popularity", dtype=Float32),
        Field(name="tags", dtype=Array(Int64)),
    ],
    source=FileSource(path="data/items.parquet", timestamp_field="event_timestamp"),
    online=True,
)

{SESSION_VIEW} = FeatureView(
    name="{SESSION_VIEW}",
    entities=[session],
    ttl=timedelta(days=36500),
    schema=[Field(name="device", dtype=Int64)],
    source=FileSource(path="data/sessions.parquet", timestamp_field="event_timestamp"),
    online=True,
)
'''


def feast_executable() -> Path:
    """The ``feast`` command of the feature server's environment; an error naming the set-up step
    when it is missing."""
    venv = Path(os.environ.get("MTS_FEAST_VENV", REPOSITORY_ROOT / ".venv-feast"))
    executable = venv / "bin" / "feast"
    if not executable.exists():
        raise FileNotFoundError(
            f"Feast's environment is missing ({executable} does not exist): run `./run setup`,"
            " which makes it, or set MTS_FEAST_VENV to a virtualenv with"
            f" feast=={FEAST_VERSION} (see examples/multi_stage/feast-requirements.txt)"
        )
    return executable


def write_repository(folder: Path, items: pd.DataFrame, sessions: pd.DataFrame) -> Path:
    """Write the feature repository into ``folder``: the store's config, the definitions and the
    source tables (``items``: item_id and the item features; ``sessions``: session_id, device)."""
    folder = Path(folder)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "feature_store.yaml").write_text(_STORE_YAML)
    (folder / "definitions.py").write_text(_DEFINITIONS)
    stamp = pd.Timestamp("2024-01-01", tz="UTC")
    items.assign(event_timestamp=stamp).to_parquet(folder / "data" / "items.parquet", index=False)
    sessions.assign(event_timestamp=stamp).to_parquet(
        folder / "data" / "sessions.parquet", index=False
    )
    return folder


def apply_and_materialize(folder: Path, timeout_s: float = 300.0) -> None:
    """``feast apply`` then ``feast materialize`` of every row into the sqlite online store."""
    _feast(folder, ["apply"], timeout_s)
    _feast(folder, ["materialize", "2000-01-01T00:00:00", "2100-01-01T00:00:00"], timeout_s)


class FeatureServer:
    """``feast serve`` on the repository in ``folder``, on a free port of 127.0.0.1; a context
    manager. ``stop`` / ``start`` restart it on the same port; ``pause`` / ``resume`` freeze it
    (SIGSTOP): connections are accepted and nothing answers, as with a hung server."""

    def __init__(self, folder: Path, *, port: int | None = None, start_timeout_s: float = 120.0):
        self.folder = Path(folder)
        self.port = port or _free_port()
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen | None = None
        handle, name = tempfile.mkstemp(prefix="feast-serve-", suffix=".log")
        os.close(handle)
        self.log_path = Path(name)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FeatureServer:
        if self._process is not None:
            return self
        command = [
            str(feast_executable()),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        with self.log_path.open("ab") as log:  # the child keeps a descriptor of its own
            self._process = subprocess.Popen(
                [*command, "--no-access-log"],
                cwd=self.folder,
                env=_feast_environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not self.answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                log = self.log_tail()
                self.stop()
                raise RuntimeError(
                    f"feast serve did not answer on {self.url} within {self.start_timeout_s:g} s;"
                    f" its log ends with:\n{log}"
                )
            time.sleep(0.2)
        self._first_lookup()
        return self

    def _first_lookup(self, timeout_s: float = 60.0) -> None:
        """One lookup of each view: the feature server's first one opens the registry and the
        online store (a second or more), which a serving step's timeout must not have to cover."""
        for view, features, entity in (
            (ITEM_VIEW, ITEM_FEATURES, "item_id"),
            (SESSION_VIEW, SESSION_FEATURES, "session_id"),
        ):
            body = {"features": [f"{view}:{name}" for name in features], "entities": {entity: [0]}}
            request = urllib.request.Request(
                self.url + "/get-online-features",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                response.read()

    def answers(self, timeout_s: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout_s) as response:
                return response.status == 200
        except OSError:
            return False

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 15.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> FeatureServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.log_path.unlink(missing_ok=True)

    def _signal(self, signum: int) -> None:
        if self._process is None:
            raise RuntimeError("the feature server is not running")
        os.killpg(self._process.pid, signum)


def _feast(folder: Path, arguments: list[str], timeout_s: float) -> None:
    done = subprocess.run(
        [str(feast_executable()), *arguments],
        cwd=folder,
        env=_feast_environment(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"`feast {' '.join(arguments)}` failed in {folder} (exit {done.returncode}):\n"
            + "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        )


def _feast_environment() -> dict[str, str]:
    """This process' environment for Feast's commands: no usage reporting, and none of this
    environment's Python settings (Feast runs on its own virtualenv's packages)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    environment["FEAST_USAGE"] = "False"
    return environment


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
