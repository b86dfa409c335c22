"""UnrollCandidates: from one row per session to one row per (session, candidate).

A ranking model scores pairs: each candidate with the features of its session (or user). The
session's candidates are ragged lists of different lengths; here every list value becomes a row,
and every session column given is repeated once per candidate of its session. Rows stay in
session order, candidates in their order, so ``TopKCandidates`` and ``SoftmaxSampling`` read the
scores back with the candidates' own offsets. Merlin Systems' ``UnrollFeatures`` repeats by the
longest list of the request instead, which breaks as soon as two sessions have different counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from merlin.dag import ColumnSelector, Node
from merlin.schema import ColumnSchema, Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import InferenceError, SchemaError
from merlin_torch_serving.ops.base import ServingOperator


class UnrollCandidates(ServingOperator):
    """One row per candidate: each ragged list column it is applied to becomes one value per row
    (same name), and the ``session_columns`` are repeated on every row of their session.

    Parameters
    ----------
    session_columns
        Session-level columns to repeat: an upstream node (all its columns, or a selection such as
        ``features["item_id-count"]``) or column names. Their names must differ from the unrolled
        columns' (``prefix`` renames them).
    prefix
        Put before the names of the repeated session columns.
    """

    def __init__(
        self, session_columns: Node | Sequence[str] | None = None, *, prefix: str = ""
    ) -> None:
        super().__init__()
        self.session_node = session_columns if isinstance(session_columns, Node) else None
        self._session_names = (
            None if isinstance(session_columns, Node) else list(session_columns or [])
        )
        self.prefix = prefix

    @property
    def label(self) -> str:
        return "UnrollCandidates"

    @property
    def dependencies(self):
        if self.session_node is not None:
            return [self.session_node]
        return [self._session_names] if self._session_names else []

    @property
    def session_names(self) -> list[str]:
        """The session columns repeated per candidate."""
        if self._session_names is not None:
            return self._session_names
        node = self.session_node
        assert node is not None  # one of the two is set by __init__
        if node.output_schema is not None:
            return node.output_schema.column_names
        return node.selector.names if node.selector is not None else []

    # ---- schemas ---------------------------------------------------------------------------

    def compute_selector(
        self, input_schema, selector, parents_selector=None, dependencies_selector=None
    ) -> ColumnSelector:
        return ColumnSelector(input_schema.column_names)

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        unrolled = self._unrolled(input_schema)
        if not unrolled:
            raise SchemaError(
                self.label,
                None,
                "ragged list columns of candidates to unroll (e.g. FilterCandidates' outputs)",
                f"none among {', '.join(map(repr, input_schema.column_names)) or 'no columns'}",
            )
        for name in unrolled:
            column = input_schema[name]
            if not wire.is_ragged(column):
                raise SchemaError(
                    self.label,
                    name,
                    "a ragged list (one list of candidates per session)",
                    describe_column(column),
                    "filter the candidates first (FilterCandidates), or pass this column as a"
                    " session column",
                )
        clash = {self.prefix + n for n in self.session_names} & set(unrolled)
        if clash:
            raise SchemaError(
                self.label,
                sorted(clash)[0],
                "session columns named apart from the unrolled candidate columns",
                "the same name on both sides",
                "pass prefix='session_' (or another) to UnrollCandidates",
            )

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        columns = []
        for name in self._unrolled(input_schema):
            column = input_schema[name]
            columns.append(
                ColumnSchema(
                    name,
                    tags=column.tags,
                    dtype=column.dtype.without_shape,
                    dims=(None,),
                )
            )
        for name in self.session_names:
            if name in input_schema.column_names:
                columns.append(input_schema[name].with_name(self.prefix + name))
        return Schema(columns)

    # ---- running -----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        session = set(self.session_names)
        unrolled = [name for name in col_selector.names if name not in session]
        offsets = np.asarray(transformable[unrolled[0]].offsets)
        columns: dict[str, Any] = {}
        for name in unrolled:
            column = transformable[name]
            if not np.array_equal(np.asarray(column.offsets), offsets):
                raise InferenceError(
                    self.label,
                    f"the candidate lists {unrolled[0]!r} and {name!r} have different lengths in"
                    " some session; unroll lists of one candidate each (ids and their scores)",
                )
            columns[name] = np.asarray(column.values)
        rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        for name in self.session_names:
            column = transformable[name]
            if column.offsets is None:
                columns[self.prefix + name] = np.asarray(column.values)[rows]
            else:
                columns[self.prefix + name] = wire.take_ragged(column.values, column.offsets, rows)
        return TensorTable(columns, _unsafe=True)

    def request_groups(self) -> list[str] | None:
        # its outputs have a row per candidate, its inputs a row per session: requests merged
        # or split by session could not be cut back by rows
        return None

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {"session_columns": self.session_names, "prefix": self.prefix}

    # ---- helpers -----------------------------------------------------------------------------

    def _unrolled(self, input_schema: Schema) -> list[str]:
        session = set(self.session_names)
        return [name for name in input_schema.column_names if name not in session]
