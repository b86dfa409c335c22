"""FilterCandidates: per session, the retrieved candidates that may be shown.

An index pads a row it cannot fill with -1 (faiss' IVF when its probed lists hold fewer items than
asked, ``RetrieveTopK`` likewise), and the session's own items or a block list (items out of stock,
withdrawn) must not reach the ranker. Merlin Systems' ``FilterCandidates`` flattens every session of
a request into one list and keeps the -1s; here each session keeps its own candidates, in order,
with their retrieval scores, as a ragged list (sessions end up with different counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from merlin.dag import Node
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.live.rules import BlockList
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.topk import single_column


class FilterCandidates(ServingOperator):
    """Drops, per session, the candidates below 0 (an index's padding), those in the session's
    ``exclude`` list and the ``block_ids``; the rest keep their order and scores.

    Parameters
    ----------
    candidates
        The candidate id column: int, ``[-1, n]`` (``RetrieveTopK``'s ``item_ids``) or a ragged
        list; by default the only int list column it receives besides ``exclude``.
    scores
        The candidates' scores (same shape), carried along; by default the only float list column,
        if any.
    exclude
        Per session, ids not to show (e.g. ``features["item_id-list"]``, the session's own items): a
        one-column selection of an upstream node or the name of a column.
    block_ids
        Ids never to show, whatever the session.
    ids_column, scores_column
        Names of the outputs: ragged lists, one per session.
    block_list
        A ``BlockList`` kept in a store: ids never to show that change while the graph serves.
    """

    def __init__(
        self,
        *,
        candidates: str | None = None,
        scores: str | None = None,
        exclude: Node | str | None = None,
        block_ids: Sequence[int] = (),
        ids_column: str = "candidate_ids",
        scores_column: str = "candidate_scores",
        block_list: BlockList | None = None,
    ):
        super().__init__()
        self.block_list = block_list
        self.candidates_name = candidates
        self.scores_name = scores
        self.exclude_node = exclude
        self.exclude_column = single_column(exclude) if exclude is not None else None
        self.block_ids = sorted({int(i) for i in block_ids})
        self.ids_column = ids_column
        self.scores_column = scores_column

    @property
    def label(self) -> str:
        return "FilterCandidates"

    @property
    def dependencies(self):
        return [self.exclude_node] if self.exclude_node is not None else []

    # ---- schemas ---------------------------------------------------------------------------

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        columns = [input_schema[self._candidates(input_schema)]]
        scores = self._scores(input_schema)
        if scores is not None:
            columns.append(input_schema[scores])
        if self.exclude_column is not None:
            columns.append(
                input_schema.get(self.exclude_column)
                or ColumnSchema(self.exclude_column, dtype="int64", dims=(None, None))
            )
        return Schema(columns)

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        candidates = input_schema[self._candidates(input_schema)]
        scores = self._scores(input_schema)
        if scores is not None and input_schema[scores].shape.dims != candidates.shape.dims:
            raise SchemaError(
                self.label,
                scores,
                f"one score per candidate, shaped as {candidates.name!r}"
                f" ({describe_column(candidates)})",
                describe_column(input_schema[scores]),
            )
        if self.exclude_column is not None:
            exclude = input_schema[self.exclude_column]
            if exclude.dtype.element_type.value != "int" or not exclude.is_list:
                raise SchemaError(
                    self.label, exclude.name, "an int list of ids", describe_column(exclude)
                )

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        columns = [
            ColumnSchema(
                self.ids_column,
                tags=[Tags.ITEM_ID],
                dtype="int64",
                dims=(None, None),
            )
        ]
        scores = self._scores(input_schema)
        if scores is not None:
            columns.append(
                ColumnSchema(
                    self.scores_column,
                    dtype=input_schema[scores].dtype.without_shape,
                    dims=(None, None),
                )
            )
        return Schema(columns)

    # ---- running -----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        names = col_selector.names
        ids, offsets = _flat(transformable[names[0]])
        ids = ids.astype(np.int64, copy=False)
        keep = ids >= 0
        invalid = int(len(ids) - keep.sum())
        refused = np.zeros(len(ids), dtype=bool)
        if self.block_ids:
            refused |= np.isin(ids, np.asarray(self.block_ids, dtype=np.int64))
        if self.block_list is not None:
            refused |= np.isin(ids, self.block_list.ids())
        if self.exclude_column is not None:
            refused |= _seen(ids, offsets, *_flat(transformable[self.exclude_column]))
        keep &= ~refused
        metrics.count(metrics.INVALID_CANDIDATES, invalid)
        metrics.count(metrics.EXCLUDED_CANDIDATES, int((refused & (ids >= 0)).sum()))
        rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        kept_offsets = wire.offsets_from_lengths(
            np.bincount(rows[keep], minlength=len(offsets) - 1)
        )
        columns: dict[str, Any] = {self.ids_column: (ids[keep], kept_offsets)}
        if self._scores_in(names):
            scores, _ = _flat(transformable[names[1]])
            columns[self.scores_column] = (scores[keep], kept_offsets)
        return TensorTable(columns, _unsafe=True)

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates_name,
            "scores": self.scores_name,
            "exclude": self.exclude_column,
            "block_ids": self.block_ids,
            "ids_column": self.ids_column,
            "scores_column": self.scores_column,
            "block_list": self.block_list.config() if self.block_list is not None else None,
        }

    def save_artifacts(self, artifact_path=None) -> None:
        if self.block_list is not None:
            self.block_list.save(artifact_path)

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        listed = config.get("block_list")
        return {**config, "block_list": BlockList.load(listed, artifact_path) if listed else None}

    def services(self) -> list[dict[str, str]]:
        return self.block_list.services() if self.block_list is not None else []

    # ---- helpers -----------------------------------------------------------------------------

    def _scores_in(self, names: list[str]) -> bool:
        return len(names) > 1 and names[1] != self.exclude_column

    def _candidates(self, input_schema: Schema) -> str:
        return self._pick(input_schema, self.candidates_name, "int", "candidates")

    def _scores(self, input_schema: Schema) -> str | None:
        if self.scores_name is None and not _lists_of(input_schema, "float", self.exclude_column):
            return None
        return self._pick(input_schema, self.scores_name, "float", "scores")

    def _pick(self, input_schema: Schema, name: str | None, kind: str, argument: str) -> str:
        if name is not None:
            if name not in input_schema.column_names:
                raise SchemaError(
                    self.label,
                    name,
                    f"a {kind} list column of {argument}",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
            return name
        found = _lists_of(input_schema, kind, self.exclude_column)
        if len(found) != 1:
            raise SchemaError(
                self.label,
                None,
                f"exactly one {kind} list column of {argument}",
                f"{len(found)} ({', '.join(map(repr, found)) or 'none'})",
                f"name it with FilterCandidates({argument}='column')",
            )
        return found[0]


def _lists_of(schema: Schema, kind: str, skip: str | None) -> list[str]:
    return [
        c.name
        for c in schema
        if c.name != skip and c.dtype.element_type.value == kind and c.is_list
    ]


def _flat(column) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values (flat) and its offsets (int64), fixed-length lists included."""
    values = np.asarray(column.values)
    if column.offsets is not None:
        return values.reshape(-1), np.asarray(column.offsets).astype(np.int64)
    width = int(np.prod(values.shape[1:])) if values.ndim > 1 else 1
    return values.reshape(-1), np.arange(values.shape[0] + 1, dtype=np.int64) * width


def _seen(
    ids: np.ndarray, offsets: np.ndarray, seen: np.ndarray, seen_offsets: np.ndarray
) -> np.ndarray:
    """Whether each candidate is in its own row's ``seen`` list."""
    rows = len(offsets) - 1
    if len(ids) == 0 or len(seen) == 0:
        return np.zeros(len(ids), dtype=bool)
    candidate_rows = np.repeat(np.arange(rows, dtype=np.int64), np.diff(offsets))
    seen_rows = np.repeat(np.arange(rows, dtype=np.int64), np.diff(seen_offsets))
    # one int64 key per (row, id): rows in the high bits, ids shifted to start at 0 below them
    low = min(int(ids.min()), int(seen.min()))
    span = max(int(ids.max()), int(seen.max())) - low + 1
    if span * max(rows, 1) < 2**62:
        return np.isin(
            candidate_rows * span + (ids.astype(np.int64) - low),
            seen_rows * span + (seen.astype(np.int64) - low),
        )
    return np.array(  # ids too far apart for one key: row by row
        [ids[i] in set(seen[seen_rows == row].tolist()) for i, row in enumerate(candidate_rows)],
        dtype=bool,
    )
