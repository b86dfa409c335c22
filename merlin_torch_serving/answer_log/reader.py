"""Reading an answer log back, while servers write it: a folder's published parquet files and the
whole flushes of its open journals, each record once."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from merlin_torch_serving.answer_log import journal, records
from merlin_torch_serving.answer_log.destinations import Destination, ParquetFolder
from merlin_torch_serving.answer_log.parquet_sink import (
    JOURNAL_PREFIX,
    PUBLISHED_PREFIX,
    PUBLISHED_SUFFIX,
    published_name,
)
from merlin_torch_serving.exceptions import AnswerLogError


def read_answers(
    source: Destination | str | os.PathLike, *, open_files: bool = True
) -> pd.DataFrame:
    """Every record of the log at ``source`` (a folder, or a ``ParquetFolder``/``RedisStream``)
    as a DataFrame, oldest answer first (no rows before the first flush); ``open_files``: with the
    flushes that the open journals of running servers hold (not yet published as parquet
    files)."""
    return read_answer_table(source, open_files=open_files).to_pandas()


def read_answer_table(
    source: Destination | str | os.PathLike, *, open_files: bool = True
) -> pa.Table:
    """``read_answers`` as an Arrow table."""
    if isinstance(source, str | os.PathLike):
        source = ParquetFolder(os.fspath(source))
    if not isinstance(source, ParquetFolder):
        from merlin_torch_serving.answer_log.redis_sink import read_stream

        return read_stream(source)
    folder = Path(source.path)
    if not folder.is_dir():
        raise AnswerLogError(
            f"no answer log at {str(folder)!r}: no such folder; pass the folder"
            " LogAnswers(ParquetFolder(...)) writes to"
        )
    # journals first: one published between the two listings is then found as its parquet file,
    # and its journal's flushes are left out below
    flushed = {}
    if open_files:
        for path in sorted(folder.glob(f"{JOURNAL_PREFIX}*{journal.SUFFIX}")):
            try:
                flushed[published_name(path.name)] = list(journal.read_frames(str(path)))
            except FileNotFoundError:
                continue  # published meanwhile
    published = sorted(folder.glob(f"{PUBLISHED_PREFIX}*{PUBLISHED_SUFFIX}"))
    tables = [pq.read_table(path) for path in published]
    names = {path.name for path in published}
    for name, frames in flushed.items():
        if name not in names:
            tables.extend(frames)
    tables = [table for table in tables if table.num_rows]
    if not tables:
        return records.EMPTY.empty_table()
    try:
        table = pa.concat_tables(tables, promote_options="default")
    except pa.ArrowInvalid as error:
        raise AnswerLogError(
            f"the answer log at {str(folder)!r} holds files of graphs whose records differ"
            f" ({error}); give each graph a folder of its own"
        ) from error
    return table.sort_by([("answered_at", "ascending")])
