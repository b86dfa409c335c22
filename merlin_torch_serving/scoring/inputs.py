"""The rows to score, as one Dask DataFrame cut into partitions of whole sessions.

Any input (a ``merlin.io.Dataset``, a Dask or pandas DataFrame, parquet files) is read as a Dask
DataFrame of the ensemble's input columns, checked and converted to the input schema's dtypes as a
request is (``frames``), and given each row's place in the input (input partition, row in it).
Then rows are hash-partitioned on the session columns: the clicks of a session meet in one
partition whichever input partitions they came from, each partition's sessions depend only on
their keys, and sorting a partition by session and place gives the same rows in the same order
however the input was cut. The input's digest (row count, and a sum of row hashes that does not
depend on the order or the cut) tells a rerun whether it scores the same rows. An ensemble that
answers rows one by one (a ranking model) keeps no rows together: the input's partitions are
scored as they come, each in its order, so part ``i`` answers input partition ``i`` row by row
(and the cut belongs to the digest then).
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.client import chunks, column_names
from merlin_torch_serving.data import frames, tables
from merlin_torch_serving.data.schemas import describe_column, schema_from_json, schema_to_json
from merlin_torch_serving.exceptions import MissingColumnsError, ScoringError

#: where each row was in the input: partition and row within it (names no input column takes)
PLACE_COLUMNS = ("__scoring_input_partition", "__scoring_input_row")
#: the file names Dask reads in a folder of parquet files
PARQUET_EXTENSIONS = (".parq", ".parquet", ".pq")


def input_frame(data, input_schema: Schema, columns: Mapping[str, str] | None, rows_per_part: int):
    """``data`` as a Dask DataFrame of the input schema's columns (renamed through ``columns``,
    the data's name -> the input's); a missing column is a ``MissingColumnsError`` naming all."""
    import dask.dataframe as dd
    from merlin.io import Dataset

    if isinstance(data, dd.DataFrame):
        frame = data
    elif isinstance(data, pd.DataFrame):
        frame = dd.from_pandas(data, npartitions=max(1, math.ceil(len(data) / rows_per_part)))
    elif isinstance(data, Dataset):
        frame = data.to_ddf()
    elif isinstance(data, str | os.PathLike):
        frame = _read_parquet(data)
    else:
        raise TypeError(
            "score a merlin.io.Dataset, a Dask or pandas DataFrame, or a path to parquet files,"
            f" not a {type(data).__name__}"
        )
    column_names.rename(frame._meta, columns)  # refuses a mapping that does not fit the data
    if columns:
        frame = frame.rename(columns=dict(columns))
    missing = [c.name for c in input_schema if c.name not in frame.columns]
    if missing:
        raise MissingColumnsError(
            {name: describe_column(input_schema[name]) for name in missing},
            [str(c) for c in frame.columns],
        )
    return frame[input_schema.column_names]


def placed(frame, input_schema: Schema):
    """``frame`` checked and converted to ``input_schema`` partition by partition, with the
    ``PLACE_COLUMNS`` of every row."""
    meta = _placed_partition(frame._meta, schema_to_json(input_schema), {"number": 0})
    return frame.map_partitions(
        _placed_partition, schema_to_json(input_schema), meta=meta, enforce_metadata=False
    )


def input_digest(frame, scheduler=None, *, cut: bool = False) -> tuple[int, str]:
    """Rows of a ``placed`` frame, and the digest of their values, the same for the same rows in
    any order and any cut into partitions; with ``cut``, of the rows of each partition in turn.
    ``scheduler``: where to compute it (``Client.get``)."""
    import dask
    from dask import delayed

    parts = [delayed(_partition_digest)(part) for part in frame.to_delayed()]
    digests = dask.compute(*parts, scheduler=scheduler)
    rows = sum(count for count, _ in digests)
    total = sum(value for _, value in digests) % 2**64
    digest = f"{rows:x}-{total:016x}"
    if cut:
        partitions = ",".join(f"{count}:{value:x}" for count, value in digests)
        digest += "-" + hashlib.sha256(partitions.encode()).hexdigest()[:16]
    return rows, digest


def partition_count(rows: int, partition_rows: int) -> int:
    return max(1, math.ceil(rows / partition_rows))


def by_session(frame, session_columns: list[str], partitions: int):
    """A ``placed`` frame hash-partitioned into ``partitions`` on ``session_columns`` (dask's
    task-based shuffle: its default P2P shuffle fails inside workers on the pinned distributed)."""
    return frame.shuffle(
        on=list(session_columns), npartitions=partitions, shuffle="tasks", ignore_index=True
    )


def in_place_order(partition: pd.DataFrame, session_columns: list[str]) -> pd.DataFrame:
    """A partition's rows sorted by session, each session's rows in input order, without the place
    columns: the same frame whatever the input's partitions were."""
    ordered = partition.sort_values([*session_columns, *PLACE_COLUMNS], kind="stable")
    return ordered.drop(columns=list(PLACE_COLUMNS)).reset_index(drop=True)


def session_batches(
    request: TensorTable, session_columns: list[str], sessions: int, max_rows: int | None
) -> Iterator[TensorTable]:
    """A partition's request (in ``in_place_order``) in runs of ``sessions`` whole sessions, each
    cut further, by whole sessions, where it has more rows than ``max_rows`` (the export's
    limit)."""
    rows = tables.num_rows(request)
    keys = [np.asarray(request[name].values) for name in session_columns]
    changed = np.zeros(rows, dtype=bool)
    changed[:1] = True
    for values in keys:
        changed[1:] |= values[1:] != values[:-1]
    starts = np.append(np.flatnonzero(changed) if session_columns else np.arange(rows), rows)
    for first in range(0, len(starts) - 1, sessions):
        batch = np.arange(starts[first], starts[min(first + sessions, len(starts) - 1)])
        yield from chunks.split(tables.take_rows(request, batch), session_columns, max_rows)


def _read_parquet(path: str | os.PathLike):
    import dask.dataframe as dd
    import pyarrow as pa

    local = Path(path)
    if "://" not in str(path) and not local.exists() and not any(c in str(path) for c in "*?["):
        raise ScoringError(
            "pass a folder of parquet files, a parquet file or a glob:"
            f" {str(path)!r} does not exist"
        )
    if "://" not in str(path):
        for file in _local_parquet_files(str(path)):
            _check_parquet_file(file)
    try:
        return dd.read_parquet(str(path))
    except (pa.ArrowException, ValueError, OSError) as error:
        raise ScoringError(
            f"check the input's files: {str(path)!r} cannot be read as parquet ({error})"
        ) from error


def _local_parquet_files(path: str) -> list[str]:
    """The files Dask reads for a local ``path``: a folder's files with a parquet extension, found
    recursively (or none but its ``_metadata`` when it has one), a glob's matches, or the file."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "_metadata")):
            return [os.path.join(path, "_metadata")]
        found = sorted(
            os.path.join(folder, name)
            for folder, _, names in os.walk(path)
            for name in names
            if name.endswith(PARQUET_EXTENSIONS)
        )
        if not found:
            raise ScoringError(
                f"pass a folder that holds the input's parquet files: {path!r} holds no file"
                f" ending in {', '.join(PARQUET_EXTENSIONS)}"
            )
        return found
    if any(c in path for c in "*?["):
        return sorted(name for name in glob.glob(path) if os.path.isfile(name))
    return [path]


def _check_parquet_file(path: str) -> None:
    """A ``ScoringError`` naming ``path`` when it is not a readable parquet file (its footer, which
    every reader reads first, is read here)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = os.path.getsize(path)
    problem = "it is empty (0 bytes)" if size == 0 else None
    if problem is None:
        try:
            pq.read_metadata(path)
        except (pa.ArrowException, OSError) as error:
            problem = f"its {size:,} bytes are not a readable parquet file ({error})"
    if problem is not None:
        raise ScoringError(
            f"replace the input file, or remove it from the input: {path!r} cannot be scored:"
            f" {problem}"
        )


def _placed_partition(partition: pd.DataFrame, schema_json: str, partition_info=None):
    schema = schema_from_json(schema_json)
    table = frames.frame_to_table(partition, schema)
    columns: dict[str, object] = {}
    for column in schema:
        data = table[column.name]
        values = np.asarray(data.values)
        scalar = data.offsets is None and values.ndim == 1
        columns[column.name] = values if scalar else partition[column.name].to_numpy()
    number = partition_info["number"] if partition_info else 0
    columns[PLACE_COLUMNS[0]] = np.full(len(partition), number, dtype=np.int64)
    columns[PLACE_COLUMNS[1]] = np.arange(len(partition), dtype=np.int64)
    return pd.DataFrame(columns)


def _partition_digest(partition: pd.DataFrame) -> tuple[int, int]:
    values = partition.drop(columns=list(PLACE_COLUMNS))
    hashes = pd.util.hash_pandas_object(values, index=False).to_numpy()
    return len(partition), int(hashes.sum(dtype=np.uint64))
