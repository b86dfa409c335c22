"""The answer log: every answer a graph gives, recorded off the request's path (``LogAnswers``), in
a folder of parquet files or a Redis stream, and read back (``read_answers``).

``destinations`` where it goes, ``records`` what a record holds, ``log_answers`` the operator,
``writer`` the thread that writes, ``journal`` and ``parquet_sink`` the folder's files,
``reader`` reading it back. Names are imported on first use: the writing side needs no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    "LogAnswers": "merlin_torch_serving.answer_log.log_answers",
    "ParquetFolder": "merlin_torch_serving.answer_log.destinations",
    "RedisStream": "merlin_torch_serving.answer_log.destinations",
    "read_answers": "merlin_torch_serving.answer_log.reader",
}

__all__ = ["LogAnswers", "ParquetFolder", "RedisStream", "read_answers"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from merlin_torch_serving.answer_log.destinations import ParquetFolder, RedisStream
    from merlin_torch_serving.answer_log.log_answers import LogAnswers
    from merlin_torch_serving.answer_log.reader import read_answers
