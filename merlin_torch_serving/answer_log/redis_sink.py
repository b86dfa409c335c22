"""The Redis stream sink: each flush added to the stream in one script call per chunk, once, and
the stream read back as records.

An entry is one answered session, its fields text: ``request_id``, ``session_id`` and the lists
``item_ids`` and ``scores`` as JSON (ids keep their type, scores their exact float32 value),
``answered_at`` in microseconds since the epoch, ``ensemble``, ``ensemble_version``, ``model``,
``model_version``, and ``branch`` and ``variant`` with a route. A chunk's script first sets a
marker key for (this process, flush, chunk) that lives an hour, and adds nothing when it is there:
a flush retried after a reply that never came (a timeout) is not added twice.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pyarrow as pa

from merlin_torch_serving.answer_log import records
from merlin_torch_serving.answer_log.destinations import RedisStream
from merlin_torch_serving.exceptions import AnswerLogError
from merlin_torch_serving.stores.redis_store import connect

#: entries per script call, and how long a flush's marker lives (seconds)
CHUNK = 500
MARKER_TTL_S = 3600
READ_PAGE = 2000

APPEND_SCRIPT = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
local maxlen, fields = tonumber(ARGV[2]), tonumber(ARGV[3])
local at, added = 4 + fields, 0
while at <= #ARGV do
  local entry = {}
  for f = 1, fields do
    entry[2 * f - 1] = ARGV[3 + f]
    entry[2 * f] = ARGV[at + f - 1]
  end
  if maxlen > 0 then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', unpack(entry))
  else
    redis.call('XADD', KEYS[1], '*', unpack(entry))
  end
  at, added = at + fields, added + 1
end
return added
"""
TEXT = ("request_id", "ensemble", "model", "branch", "variant")
NUMBERS = ("answered_at", "ensemble_version", "model_version")
JSON = ("session_id", "item_ids", "scores")


class StreamSink:
    """Adds flushes to a ``RedisStream`` from one process."""

    def __init__(self, destination: RedisStream):
        self.destination = destination
        self._client = connect(destination.redis)
        self._append = self._client.register_script(APPEND_SCRIPT)
        self._writer_id = uuid.uuid4().hex[:12]

    def write(self, table: pa.Table, number: int) -> None:
        names, columns = _fields(table)
        for start in range(0, table.num_rows, CHUNK):
            chunk = [column[start : start + CHUNK] for column in columns]
            values = [value for row in zip(*chunk, strict=True) for value in row]
            marker = f"{self.destination.key}:written:{self._writer_id}:{number}:{start}"
            self._append(
                keys=[self.destination.key, marker],
                args=[MARKER_TTL_S, self.destination.max_length or 0, len(names), *names, *values],
            )

    def tick(self) -> None:
        """Nothing to publish: an entry is readable once added."""

    def close(self) -> None:
        self._client.close()


def _fields(table: pa.Table) -> tuple[list[str], list[list[str]]]:
    """The entry fields of ``table``'s records: names, then one list of texts per field."""
    names, columns = [], []
    for name in table.column_names:
        column = table[name]
        if column.null_count == len(column) and name in ("branch", "variant"):
            continue  # no route
        if name == "answered_at":
            texts = [str(v) for v in column.cast(pa.int64()).to_pylist()]
        elif name in JSON:
            texts = [json.dumps(v, separators=(",", ":")) for v in column.to_pylist()]
        else:
            texts = ["" if v is None else str(v) for v in column.to_pylist()]
        names.append(name)
        columns.append(texts)
    return names, columns


def read_stream(destination: RedisStream) -> pa.Table:
    """Every entry of the stream as records, oldest first."""
    client = connect(destination.redis)
    entries: list[dict] = []
    try:
        start = "-"
        while True:
            page = client.xrange(destination.key, min=start, count=READ_PAGE)
            entries.extend(fields for _, fields in page)
            if len(page) < READ_PAGE:
                break
            start = "(" + page[-1][0].decode()
    except Exception as error:  # redis's own errors: unreachable, refused, timed out
        raise AnswerLogError(
            f"the {destination.describe()} cannot be read: {type(error).__name__}: {error}; check"
            " that the server answers and the settings (password_env, ca_file) match it"
        ) from error
    finally:
        client.close()
    if not entries:
        return records.EMPTY.empty_table()
    return _table([{k.decode(): v.decode() for k, v in e.items()} for e in entries])


def _table(entries: list[dict[str, str]]) -> pa.Table:
    def column(name):
        return [entry.get(name) for entry in entries]

    sessions = [json.loads(v) for v in column("session_id")]
    items = [json.loads(v) for v in column("item_ids")]
    return pa.table(
        {
            "request_id": pa.array(column("request_id"), pa.string()),
            "session_id": pa.array(sessions, _id_type(sessions)),
            "answered_at": pa.array(
                np.array(column("answered_at"), dtype=np.int64), pa.timestamp("us", tz="UTC")
            ),
            "ensemble": pa.array(column("ensemble"), pa.string()),
            "ensemble_version": pa.array(np.array(column("ensemble_version"), dtype=np.int64)),
            "model": pa.array(column("model"), pa.string()),
            "model_version": pa.array(np.array(column("model_version"), dtype=np.int64)),
            "branch": pa.array(column("branch"), pa.string()),
            "variant": pa.array(column("variant"), pa.string()),
            "item_ids": pa.array(items, pa.list_(_id_type([i for row in items for i in row]))),
            "scores": pa.array([json.loads(v) for v in column("scores")], pa.list_(pa.float32())),
        }
    )


def _id_type(values: list) -> pa.DataType:
    return pa.string() if any(isinstance(v, str) for v in values) else pa.int64()
