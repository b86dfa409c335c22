"""The output folder of a scoring run: one parquet file per partition, each written atomically, and
the record of the run that tells a rerun which files it may keep.

    <output>/
      _scoring.json              what is being scored: ensemble, export digest, input, partitions
      part-00000.parquet ...     one row per session; the run's key in the file's metadata
      _repository/               (scoring an in-memory Ensemble) the export that was scored

A part is written to a temporary file beside it and renamed into place, so a killed worker leaves
no half-written part behind. A part counts as done when its metadata carries the key of the
current run: the same export (its digest), the same input (its digest) cut into the same number
of partitions. Readers of the folder (pandas, pyarrow, Dask) skip names starting with ``_``.

Nothing else may be in the folder (hidden files aside), since ``pd.read_parquet(output)`` reads
every parquet file under it: a folder holding files scoring does not write is refused, naming them,
and nothing of the user's is ever removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from merlin_torch_serving.exceptions import ScoringError

RECORD_FILE = "_scoring.json"
REPOSITORY_DIR = "_repository"
PART_METADATA_KEY = b"merlin_torch_serving.scoring"
_TEMPORARY_SUFFIX = ".writing"
_PART_NAME = re.compile(r"part-\d{5,}\.parquet")


@dataclass(frozen=True)
class RunRecord:
    """What a run scores: a rerun with the same record keeps the parts already written."""

    ensemble: str
    repository: str
    export_digest: str
    input_rows: int
    input_digest: str
    partitions: int
    session_columns: list[str]

    @property
    def key(self) -> str:
        """Names the run in every part it writes (a rerun that differs in any field scores anew)."""
        fields = asdict(self)
        fields.pop("repository")  # the same export scored from another path is the same run
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def part_name(partition: int) -> str:
    return f"part-{partition:05d}.parquet"


def refuse_foreign_files(output: Path) -> None:
    """A ``ScoringError`` naming what ``output`` holds that scoring does not write (its answers
    would be read back mixed with it), hidden files aside; nothing when it does not exist."""
    if not output.is_dir():
        return
    foreign = sorted(
        entry.name + ("/" if entry.is_dir() else "")
        for entry in output.iterdir()
        if not _written_by_scoring(entry) and not entry.name.startswith(".")
    )
    if foreign:
        shown = ", ".join(map(repr, foreign[:10]))
        more = f" and {len(foreign) - 10} more" if len(foreign) > 10 else ""
        raise ScoringError(
            f"write into another folder (a new or empty one), or move them out: {str(output)!r}"
            f" holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} scoring does not"
            f" write, which readers of the answers (pd.read_parquet of the folder, Dask) would"
            f" read with them: {shown}{more}"
        )


def _written_by_scoring(entry: Path) -> bool:
    name = entry.name
    if entry.is_dir():
        return name == REPOSITORY_DIR
    return (
        name == RECORD_FILE
        or _PART_NAME.fullmatch(name) is not None
        or name.endswith(_TEMPORARY_SUFFIX)
    )


def start_run(output: Path, record: RunRecord, *, overwrite: bool) -> None:
    """Make ``output`` ready for ``record``'s run: keep it as it is for a rerun of the same run,
    empty it of another run's parts with ``overwrite``, refuse otherwise; refuse it whatever
    ``overwrite`` says when it holds files scoring does not write."""
    refuse_foreign_files(output)
    output.mkdir(parents=True, exist_ok=True)
    previous = read_record(output)
    parts = sorted(output.glob("part-*.parquet"))
    if previous is not None and previous.key != record.key and not overwrite:
        difference = _difference(previous, record)
        raise ScoringError(
            f"pass overwrite=True (--overwrite) to replace them, or write into another folder:"
            f" {str(output)!r} holds the answers of another scoring run ({difference})"
        )
    if previous is None and parts and not overwrite:
        raise ScoringError(
            f"pass overwrite=True (--overwrite) to replace them, or write into another folder:"
            f" {str(output)!r} holds {len(parts)} part files that no scoring run recorded"
        )
    if previous is None or previous.key != record.key:
        for part in parts:
            part.unlink()
    remove_leftovers(output)
    _write_atomically(output / RECORD_FILE, json.dumps(asdict(record), indent=1).encode())


def remove_leftovers(output: Path) -> None:
    """Remove the temporary files of parts whose writer was killed while writing."""
    for leftover in output.glob(f"*{_TEMPORARY_SUFFIX}"):
        leftover.unlink(missing_ok=True)


def read_record(output: Path) -> RunRecord | None:
    path = output / RECORD_FILE
    if not path.is_file():
        return None
    try:
        return RunRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise ScoringError(
            f"remove {str(path)!r} or write into another folder: it is not a scoring record"
            f" ({error})"
        ) from error


def done_parts(output: Path, record: RunRecord) -> dict[int, dict]:
    """Partition -> what its part holds (sessions, clicks), for the parts ``record``'s run wrote."""
    done = {}
    for partition in range(record.partitions):
        path = output / part_name(partition)
        if not path.is_file():
            continue
        try:
            metadata = pq.read_schema(path).metadata or {}
        except (OSError, pa.ArrowException):
            continue  # unreadable: scored again
        written = json.loads(metadata.get(PART_METADATA_KEY, b"{}"))
        if written.get("run") == record.key and written.get("partition") == partition:
            done[partition] = written
    return done


def write_part(output: Path, partition: int, answer: pa.Table, facts: dict) -> None:
    """Write partition ``partition``'s answer, with ``facts`` (the run's key, counts) in its
    metadata, under a temporary name first, then renamed into place."""
    metadata = {PART_METADATA_KEY: json.dumps({**facts, "partition": partition}).encode()}
    table = answer.replace_schema_metadata(metadata)
    path = output / part_name(partition)
    temporary = path.with_name(f"{path.name}.{uuid.uuid4().hex}{_TEMPORARY_SUFFIX}")
    try:
        pq.write_table(table, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f"{path.name}.{uuid.uuid4().hex}{_TEMPORARY_SUFFIX}")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _difference(previous: RunRecord, current: RunRecord) -> str:
    """What differs between two runs, in words."""
    if previous.export_digest != current.export_digest:
        return (
            f"ensemble {previous.ensemble!r} of {previous.repository!r}, export digest"
            f" {previous.export_digest[:12]}..., not {current.export_digest[:12]}..."
        )
    if (previous.input_rows, previous.input_digest) != (current.input_rows, current.input_digest):
        return (
            f"another input: {previous.input_rows:,} rows of digest"
            f" {previous.input_digest[:12]}..., not {current.input_rows:,} rows of"
            f" {current.input_digest[:12]}..."
        )
    return (
        f"the input cut into {previous.partitions} partitions by {previous.session_columns}, not"
        f" {current.partitions} by {current.session_columns}"
    )
