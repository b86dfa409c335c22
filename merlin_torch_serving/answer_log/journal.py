"""A folder log's open file: what each flush appended, framed so that a reader (or the process that
takes it over after a crash) finds every whole flush and stops at a torn one.

A frame is ``MAGIC``, the body's length and CRC-32, then the body: an Arrow IPC stream of one
flush's records. The writing process holds an exclusive ``flock`` on the file for as long as it
writes it; the lock goes with the process, even a killed one, so a journal nobody locks is an
orphan that another process may publish. A flush whose write fails (a full disk) is cut off again,
so the file always ends with a whole frame.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import zlib
from collections.abc import Iterator

import pyarrow as pa

MAGIC = b"MTSA"
_HEADER = struct.Struct("<4sQI")  # magic, body length, CRC-32 of the body
SUFFIX = ".journal"


class Journal:
    """An open file this process appends flushes to, locked against every other process."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.size = 0
        self.frames = 0

    def append(self, table: pa.Table) -> None:
        """Write ``table`` as one frame and sync it; on a failure the file is as it was."""
        body = _ipc_bytes(table)
        frame = _HEADER.pack(MAGIC, len(body), zlib.crc32(body)) + body
        try:
            written = 0
            while written < len(frame):
                written += os.pwrite(self._fd, frame[written:], self.size + written)
            os.fsync(self._fd)
        except OSError:
            # cut the torn frame off; if even that fails, readers stop at it all the same
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.size)
            raise
        self.size += len(frame)
        self.frames += 1

    def close(self) -> None:
        """Let go of the file (and its lock)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_frames(path: str) -> Iterator[pa.Table]:
    """The whole frames of the journal at ``path``, in order; a torn or corrupt frame ends it."""
    with open(path, "rb") as file:
        while True:
            header = file.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return
            magic, length, checksum = _HEADER.unpack(header)
            if magic != MAGIC:
                return
            body = file.read(length)
            if len(body) < length or zlib.crc32(body) != checksum:
                return
            yield pa.ipc.open_stream(pa.py_buffer(body)).read_all()


def try_lock(path: str) -> int | None:
    """A descriptor holding the exclusive lock of the journal at ``path`` when no process holds
    it (its writer is gone), still the file at ``path``; None otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # another process may have published and removed it between our open and our lock
        if os.stat(path).st_ino != os.fstat(fd).st_ino:
            raise FileNotFoundError(path)
    except OSError:
        os.close(fd)
        return None
    return fd


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
