"""Where an answer log goes: a folder of parquet files (needs no service) or a Redis stream
(shared by servers). Settings only, JSON-able for the export; the writing side is in the sinks."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from merlin_torch_serving.stores.settings import RedisSettings, settings_from_config

#: the defaults of a folder's rotation: a file is published at this size or this age
ROTATE_BYTES = 64 * 1024 * 1024
ROTATE_AFTER_S = 60.0
#: the timeouts of a Redis stream given by its URL
LOG_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ParquetFolder:
    """Answers as parquet files in ``path`` (made if missing), one open file per serving process.

    Each flush appends to that process's open file (``_open-*.journal``, skipped by parquet readers
    as every name starting with ``_`` is); once it holds ``rotate_bytes`` or is ``rotate_after_s``
    old, it is written out as ``answers-*.parquet``, published whole (written under a hidden name,
    then renamed). ``path`` is made absolute here: the server runs in another folder.
    """

    path: str
    rotate_bytes: int = ROTATE_BYTES
    rotate_after_s: float = ROTATE_AFTER_S

    kind = "parquet"

    def __post_init__(self):
        object.__setattr__(self, "path", os.path.abspath(os.fspath(self.path)))
        if int(self.rotate_bytes) < 1:
            raise ValueError(f"rotate_bytes must be at least 1, got {self.rotate_bytes!r}")
        _positive("rotate_after_s", self.rotate_after_s)

    @property
    def url(self) -> str:
        return Path(self.path).as_uri()

    def describe(self) -> str:
        return f"folder {self.path!r}"


@dataclass(frozen=True)
class RedisStream:
    """Answers as entries of a Redis stream, one per answered session, for servers that share one
    log (and for consumers of their own: the fields are text).

    Parameters
    ----------
    redis
        The server: a ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL, or ``RedisSettings``
        for a password (named by its environment variable), TLS files and timeouts; a URL gets
        ``LOG_TIMEOUT_S`` timeouts (the log writes from a thread of its own, no request waits).
    stream
        The stream's key, after the settings' ``key_prefix``: ``<prefix>:<stream>``.
    max_length
        Trim the stream to about that many entries (Redis's ``MAXLEN ~``); None keeps them all.
    """

    redis: RedisSettings
    stream: str = "answers"
    max_length: int | None = None

    kind = "redis"

    def __post_init__(self):
        if isinstance(self.redis, str):
            settings = RedisSettings(
                self.redis, timeout_s=LOG_TIMEOUT_S, connect_timeout_s=LOG_TIMEOUT_S
            )
            object.__setattr__(self, "redis", settings)
        elif isinstance(self.redis, dict):
            object.__setattr__(self, "redis", settings_from_config(self.redis))
        if not self.stream:
            raise ValueError("a RedisStream needs a stream name")
        if self.max_length is not None and int(self.max_length) < 1:
            raise ValueError(f"max_length must be at least 1 or None, got {self.max_length!r}")

    @property
    def key(self) -> str:
        return f"{self.redis.key_prefix}:{self.stream}"

    @property
    def url(self) -> str:
        return self.redis.describe()

    def describe(self) -> str:
        return f"Redis stream {self.key!r} at {self.redis.describe()}"


Destination = ParquetFolder | RedisStream
KINDS: dict[str, type] = {"parquet": ParquetFolder, "redis": RedisStream}


def destination_config(destination: Destination) -> dict[str, Any]:
    if isinstance(destination, RedisStream):
        return {
            "kind": destination.kind,
            "redis": destination.redis.config(),
            "stream": destination.stream,
            "max_length": destination.max_length,
        }
    return {"kind": destination.kind, **asdict(destination)}


def destination_from_config(config: dict[str, Any]) -> Destination:
    settings = {key: value for key, value in config.items() if key != "kind"}
    kind = KINDS.get(config.get("kind", ""))
    if kind is None:
        raise ValueError(
            f"unknown answer log destination {config.get('kind')!r}; this version writes to"
            f" {', '.join(KINDS)}"
        )
    return kind(**settings)


def _positive(name: str, value) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
