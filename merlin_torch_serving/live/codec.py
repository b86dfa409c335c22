"""A click as a store keeps it: the request row's values packed into bytes, exactly, and its key.

Numbers, booleans and datetimes pack as one numpy record (their exact bits, so a click read back
feeds the workflow bit for bit as it came); text values follow it, each as a type byte (str or
bytes, kept as it came), a length and the UTF-8 or raw bytes. Every payload starts with a
fingerprint of the columns it holds: clicks written by a graph with other click columns are not
read back as this one's (they are left out, as an expired session would be).

A click's key is its event id when the graph names one, else a digest of the whole packed row
(session, time, item and every other column): a click sent again, by a retry or a failover,
packs to the same bytes and so has the same key.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np
from merlin.schema import Schema

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import SchemaError

FINGERPRINT_BYTES = 4
_TEXT_HEADER = struct.Struct("<BI")  # kind (0: str, 1: bytes), length
_STR, _BYTES = 0, 1


class ClickCodec:
    """Packs and unpacks the rows of ``schema``'s columns (scalar columns only)."""

    def __init__(self, schema: Schema, label: str = "SessionHistory"):
        fixed, self.text_columns = [], []
        for column in schema:
            if column.is_list:
                raise SchemaError(
                    label,
                    column.name,
                    "one value per click (a scalar column)",
                    "a list column",
                    "store list features per item elsewhere (LookupFeatures) and send scalars",
                )
            dtype = wire.column_numpy_dtype(column)
            if dtype.kind == "O":
                self.text_columns.append(column.name)
            else:
                fixed.append((column.name, dtype))
        self.columns = list(schema.column_names)
        self.record = np.dtype(fixed)
        description = repr([(c.name, str(wire.column_numpy_dtype(c))) for c in schema])
        self.fingerprint = hashlib.blake2b(
            description.encode(), digest_size=FINGERPRINT_BYTES
        ).digest()

    def pack(self, columns: dict[str, np.ndarray]) -> list[bytes]:
        """One payload per row of ``columns`` (name -> 1-D values, every column of the schema)."""
        rows = len(columns[self.columns[0]]) if self.columns else 0
        records = np.empty(rows, dtype=self.record)
        for name in self.record.names or ():
            records[name] = columns[name]
        flat = records.tobytes()
        size = self.record.itemsize
        payloads = []
        for row in range(rows):
            parts = [self.fingerprint, flat[row * size : (row + 1) * size]]
            for name in self.text_columns:
                parts.append(_pack_text(columns[name][row]))
            payloads.append(b"".join(parts))
        return payloads

    def unpack(self, payloads: Sequence[bytes]) -> dict[str, np.ndarray]:
        """The columns of ``payloads`` (those of this codec's columns; others are left out)."""
        mine = [p for p in payloads if p[:FINGERPRINT_BYTES] == self.fingerprint]
        size = self.record.itemsize
        start = FINGERPRINT_BYTES
        records = np.frombuffer(b"".join(p[start : start + size] for p in mine), self.record)
        columns: dict[str, np.ndarray] = {
            name: records[name].copy() for name in self.record.names or ()
        }
        if self.text_columns:
            texts = [_unpack_texts(p[start + size :], len(self.text_columns)) for p in mine]
            for index, name in enumerate(self.text_columns):
                values = np.empty(len(mine), dtype=object)
                values[:] = [row[index] for row in texts]
                columns[name] = values
        return {name: columns[name] for name in self.columns}


def click_keys(payloads: Sequence[bytes], event_ids: np.ndarray | None) -> list[bytes]:
    """Each click's identity: its event id (as text) when given, else a digest of its payload."""
    if event_ids is not None:
        return [b"e:" + str(_plain(value)).encode() for value in event_ids]
    return [hashlib.blake2b(payload, digest_size=16).digest() for payload in payloads]


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if isinstance(value, np.generic) else value


def _pack_text(value) -> bytes:
    if isinstance(value, bytes | np.bytes_):
        data, kind = bytes(value), _BYTES
    else:
        data, kind = str(value).encode(), _STR
    return _TEXT_HEADER.pack(kind, len(data)) + data


def _unpack_texts(data: bytes, count: int) -> list:
    values, offset = [], 0
    for _ in range(count):
        kind, length = _TEXT_HEADER.unpack_from(data, offset)
        offset += _TEXT_HEADER.size
        raw = data[offset : offset + length]
        offset += length
        values.append(raw if kind == _BYTES else raw.decode())
    return values
