"""The answer log: every answer a graph gives, recorded off the request's path (``LogAnswers``), in
a folder of parquet files or a Redis stream, and read back (``read_answers``).

``destinations`` where it goes, ``records`` what a record holds, ``log_answers`` the operator,
``writer`` the thread that writes, ``journal`` and ``parquet_sink`` the folder's files,
``reader`` reading it back.
"""

from merlin_torch_serving.answer_log.destinations import ParquetFolder, RedisStream
from merlin_torch_serving.answer_log.log_answers import LogAnswers
from merlin_torch_serving.answer_log.reader import read_answers

__all__ = ["LogAnswers", "ParquetFolder", "RedisStream", "read_answers"]
