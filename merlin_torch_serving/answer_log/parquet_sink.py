"""The folder sink: each flush appended to this process's journal, the journal published as one
parquet file once it is big or old enough, and journals left by killed processes published by the
next one to start.

Publishing writes ``.answers-<id>.parquet.tmp``, syncs it, renames it ``answers-<id>.parquet`` and
only then removes ``_open-<id>.journal``; a journal's parquet name follows from its own, so a
process killed between the rename and the removal leaves a journal whose parquet file exists, and
whoever finds it removes it instead of publishing it again: a record is never in two published
files. Readers of the folder see whole files only (``reader`` adds the open journals' flushes).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from merlin_torch_serving.answer_log import journal
from merlin_torch_serving.answer_log.destinations import ParquetFolder

logger = logging.getLogger(__name__)

JOURNAL_PREFIX = "_open-"
PUBLISHED_PREFIX = "answers-"
PUBLISHED_SUFFIX = ".parquet"


def published_name(journal_name: str) -> str:
    """The parquet file a journal is published as."""
    stem = journal_name[len(JOURNAL_PREFIX) : -len(journal.SUFFIX)]
    return f"{PUBLISHED_PREFIX}{stem}{PUBLISHED_SUFFIX}"


class FolderSink:
    """Writes a ``ParquetFolder`` for one process."""

    def __init__(self, destination: ParquetFolder):
        self.destination = destination
        self.folder = Path(destination.path)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._writer_id = uuid.uuid4().hex[:12]
        self._sequence = 0
        self._journal: journal.Journal | None = None
        self._opened_at = 0.0
        self.recover()

    def write(self, table: pa.Table, number: int = 0) -> None:
        """Append ``table`` to the journal (synced when this returns); a failed append leaves the
        journal as it was, so a retry writes the records once."""
        if self._journal is None:
            self._open()
        assert self._journal is not None
        self._journal.append(table)

    def tick(self) -> None:
        """Publish the journal once it is big or old enough (called after every flush, with
        records or not); a failure leaves it open, to be published at a later flush."""
        if self._journal is None:
            return
        big = self._journal.size >= self.destination.rotate_bytes
        if big or time.monotonic() - self._opened_at >= self.destination.rotate_after_s:
            self.publish()

    def publish(self) -> None:
        """Publish the open journal as a parquet file; a failure (a full disk) leaves it open, to be
        published at a later flush."""
        if self._journal is None:
            return
        if self._journal.frames:
            publish_journal(self._journal.path)
        else:
            os.unlink(self._journal.path)
        self._journal.close()
        self._journal = None

    def recover(self) -> int:
        """Publish the journals of processes that are gone; how many."""
        published = 0
        for path in sorted(self.folder.glob(f"{JOURNAL_PREFIX}*{journal.SUFFIX}")):
            if self._journal is not None and str(path) == self._journal.path:
                continue
            fd = journal.try_lock(str(path))
            if fd is None:
                continue  # a live process writes it
            try:
                publish_journal(str(path))
                published += 1
            except OSError:
                logger.exception("publishing the answer log journal %r failed", str(path))
            finally:
                os.close(fd)
        return published

    def close(self) -> None:
        self.publish()

    def _open(self) -> None:
        self._sequence += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"{JOURNAL_PREFIX}{stamp}-{self._writer_id}-{self._sequence:06d}{journal.SUFFIX}"
        self._journal = journal.Journal(str(self.folder / name))
        self._opened_at = time.monotonic()
        _sync_folder(self.folder)


def publish_journal(path: str) -> None:
    """Write the whole frames of the journal at ``path`` as its parquet file, then remove it."""
    source = Path(path)
    target = source.parent / published_name(source.name)
    if not target.exists():
        tables = list(journal.read_frames(path))
        if tables:
            _write_whole(pa.concat_tables(tables), target)
    source.unlink()
    _sync_folder(source.parent)


def _write_whole(table: pa.Table, target: Path) -> None:
    """``table`` as the parquet file ``target``, which appears whole or not at all."""
    hidden = target.parent / f".{target.name}.tmp"
    try:
        with open(hidden, "wb") as file:
            pq.write_table(table, file)
            file.flush()
            os.fsync(file.fileno())
        os.rename(hidden, target)
    except BaseException:
        hidden.unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)


def _sync_folder(folder: Path) -> None:
    """Make a file's creation, rename or removal in ``folder`` survive a crash of the machine."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
