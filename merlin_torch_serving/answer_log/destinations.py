"""Where an answer log goes: a folder of parquet files (needs no service) or a Redis stream
(shared by servers). Settings only, JSON-able for the export; the writing side is in the sinks."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: the defaults of a folder's rotation: a file is published at this size or this age
ROTATE_BYTES = 64 * 1024 * 1024
ROTATE_AFTER_S = 60.0


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
    """Answers as entries of the Redis stream ``stream``, one per answered session, for servers that
    share one log. ``url``: ``redis://`` or ``rediss://`` (TLS); ``max_length``: the stream is
    trimmed to about that many entries (Redis's ``MAXLEN ~``), None to keep every entry."""

    url: str
    stream: str = "mts:answers"
    max_length: int | None = None

    kind = "redis"

    def __post_init__(self):
        if not self.stream:
            raise ValueError("a RedisStream needs a stream name")
        if self.max_length is not None and int(self.max_length) < 1:
            raise ValueError(f"max_length must be at least 1 or None, got {self.max_length!r}")

    def describe(self) -> str:
        return f"Redis stream {self.stream!r}"


Destination = ParquetFolder | RedisStream
KINDS: dict[str, type] = {"parquet": ParquetFolder, "redis": RedisStream}


def destination_config(destination: Destination) -> dict[str, Any]:
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
