"""LogAnswers: the operator at the end of a graph that records every answer it passes on, for the
read-out of experiments and the training of the next model.

It passes its input on unchanged and hands a copy of what it needs to the answer log's writer
(``writer``), which writes it from a thread of its own: the answer never waits for the log, and a
log that is full, slow or gone fails no request (its answers are dropped and counted).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
from merlin.dag import Node
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.answer_log import records
from merlin_torch_serving.answer_log.destinations import (
    Destination,
    destination_config,
    destination_from_config,
)
from merlin_torch_serving.answer_log.writer import (
    FLUSH_INTERVAL_S,
    AnswerWriter,
    WriterStatus,
)
from merlin_torch_serving.data import tables
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import InferenceError, SchemaError
from merlin_torch_serving.graph import answering, metrics
from merlin_torch_serving.graph.rehearsal import is_rehearsal
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.topk import single_column
from merlin_torch_serving.routing.experiment import session_buckets

#: the salt of the sample's hash: sessions sampled apart from any experiment's split
SAMPLE_SALT = "merlin_torch_serving.answer_log.sample"


class LogAnswers(ServingOperator):
    """Record each answer it passes on (one record per session; see ``records`` for the fields).

    Parameters
    ----------
    destination
        ``ParquetFolder(path)`` (a folder of parquet files, no service needed) or
        ``RedisStream(url)`` (a stream servers share).
    session_ids
        The session id column: a one-column selection of an upstream node (the workflow's node the
        graph is built on, ``features["session_id"]``: another node of the same workflow would
        run it twice) or the name of a column it receives.
    items, scores
        The columns of the items shown and their scores (``TopK``'s by default): lists per session.
    item_count
        How many of a fixed-length list's items were shown (the multi-stage pipeline's
        ``item_count``); by default that column when it receives it, else every item.
    branch, variant
        A route's columns, recorded when it receives them.
    flush_interval_s
        How often the writer writes: what a killed server loses at most.
    sample_rate
        The share of sessions logged (all their answers, or none): a stable hash of the session id.
    session_id_key
        Record each session id as its BLAKE2b hash keyed with this secret (32 hex characters);
        the read-out needs the same key to join clicks.
    max_pending
        Records waiting to be written at most; more are dropped (and counted) while the
        destination fails.
    """

    def __init__(
        self,
        destination: Destination,
        *,
        session_ids: Node | str = "session_id",
        items: str = "item_ids",
        scores: str = "item_scores",
        item_count: str | None = None,
        branch: str | None = "branch",
        variant: str | None = "variant",
        flush_interval_s: float = FLUSH_INTERVAL_S,
        sample_rate: float = 1.0,
        session_id_key: str | None = None,
        max_pending: int = 100_000,
    ):
        super().__init__()
        if isinstance(destination, dict):
            destination = destination_from_config(destination)
        self.destination = destination
        self.session_node = session_ids if isinstance(session_ids, Node) else None
        self.session_column = single_column(session_ids)
        self.items, self.scores = items, scores
        self.item_count = item_count
        self.branch, self.variant = branch, variant
        # the optional columns it records: as given until the graph shows which it receives
        self._recorded: dict[str, str | None] = {
            "count": item_count,
            "branch": branch,
            "variant": variant,
        }
        if not (math.isfinite(flush_interval_s) and flush_interval_s > 0):
            raise ValueError(
                f"flush_interval_s must be a positive number, got {flush_interval_s!r}"
            )
        if not (0 < sample_rate <= 1):
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if int(max_pending) < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}")
        self.flush_interval_s = float(flush_interval_s)
        self.sample_rate = float(sample_rate)
        self.session_id_key = session_id_key
        self.max_pending = int(max_pending)
        self._writer: AnswerWriter | None = None
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"LogAnswers({self.destination.describe()})"

    @property
    def dependencies(self):
        return [self.session_node] if self.session_node is not None else []

    def status(self) -> WriterStatus | None:
        """How its writer fares in this process; None before it logged anything here."""
        return None if self._writer is None else self._writer.status()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until what it logged so far is written (in this process)."""
        return True if self._writer is None else self._writer.flush(timeout_s)

    def close(self) -> None:
        """Write what is queued and publish what is open; later answers start a new writer."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    # ---- graph building ---------------------------------------------------------------------

    def compute_input_schema(self, root_schema, parents_schema, deps_schema, selector) -> Schema:
        self._passed = parents_schema.column_names
        return super().compute_input_schema(root_schema, parents_schema, deps_schema, selector)

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        passed = getattr(self, "_passed", input_schema.column_names)
        return Schema([input_schema[name] for name in input_schema.column_names if name in passed])

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        session = self._column(input_schema, self.session_column, "the session id column")
        if session.is_list:
            raise SchemaError(
                self.label, session.name, "a scalar session id", describe_column(session)
            )
        for name, what in ((self.items, "item ids"), (self.scores, "scores")):
            column = self._column(input_schema, name, f"a list of the {what} shown")
            if not column.is_list:
                raise SchemaError(self.label, name, f"a list of {what}", describe_column(column))
        count = self.item_count or (
            "item_count" if "item_count" in input_schema.column_names else None
        )
        received = input_schema.column_names
        self._recorded = {
            "count": count,
            "branch": self.branch if self.branch in received else None,
            "variant": self.variant if self.variant in received else None,
        }
        if count is not None:
            self._column(input_schema, count, "the number of items shown")

    def _column(self, schema: Schema, name: str, what: str):
        if name not in schema.column_names:
            hint = (
                f"pass session_ids=features[{name!r}] (the workflow's node) to LogAnswers"
                if name == self.session_column
                else "name the column it receives"
            )
            raise SchemaError(
                self.label,
                name,
                what,
                f"no such column (it receives {', '.join(map(repr, schema.column_names))})",
                hint,
            )
        return schema[name]

    # ---- running ----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        whom = answering.current()
        if is_rehearsal():
            if whom is not None and whom.model:
                # a served step warming up: start writing (and publish what a killed server left)
                self._writer_here()
        elif whom is None or whom.seen_by_someone:
            self._log(whom, transformable)
        return transformable

    def _log(self, whom: answering.Answering | None, table: TensorTable) -> None:
        rows = tables.num_rows(table)
        owners = None
        if whom is not None and whom.answer_rows is not None:
            if sum(whom.answer_rows) != rows:
                raise InferenceError(
                    self.label,
                    f"it received {rows} rows for answers of {sum(whom.answer_rows)} rows; put"
                    " LogAnswers last in the graph",
                )
            owners = np.repeat(np.arange(len(whom.answer_rows)), whom.answer_rows)
        sessions = np.asarray(table[self.session_column].values)
        kept = None
        if self.sample_rate < 1:
            kept = np.flatnonzero(session_buckets(sessions, SAMPLE_SALT) < self.sample_rate)
        columns = {name: table[name] for name in (self.items, self.scores)}
        optional = self._recorded
        answers = records.taken(
            whom,
            owners,
            kept,
            sessions,
            columns[self.items],
            columns[self.scores],
            **{key: np.asarray(table[name].values) for key, name in optional.items() if name},
        )
        writer = self._writer_here()
        if answers.rows:
            writer.submit(answers)
        if metrics.is_collecting():
            counts = writer.take_counts()
            metrics.count(metrics.ANSWER_LOG_WRITTEN, counts.written)
            metrics.count(metrics.ANSWER_LOG_DROPPED, counts.dropped)
            metrics.count(metrics.ANSWER_LOG_FAILED_FLUSHES, counts.failed_flushes)

    def _writer_here(self) -> AnswerWriter:
        writer = self._writer
        if writer is None:
            with self._lock:
                if self._writer is None:
                    self._writer = AnswerWriter(
                        self.destination,
                        flush_interval_s=self.flush_interval_s,
                        max_pending=self.max_pending,
                        session_id_key=self.session_id_key,
                    )
                writer = self._writer
        return writer

    # ---- export -----------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "destination": destination_config(self.destination),
            "session_ids": self.session_column,
            "items": self.items,
            "scores": self.scores,
            # the optional columns it records, as the graph resolved them
            "item_count": self._recorded["count"],
            "branch": self._recorded["branch"],
            "variant": self._recorded["variant"],
            "flush_interval_s": self.flush_interval_s,
            "sample_rate": self.sample_rate,
            "session_id_key": self.session_id_key,
            "max_pending": self.max_pending,
        }

    def services(self) -> list[dict[str, str]]:
        return [{"name": "answer log", "url": self.destination.url}]
