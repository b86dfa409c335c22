"""TopK: the k best items per row over the whole catalog's scores, with exclusions.

The selection is a TorchScript-compatible function, so the same kernel can run in-process, in the
python backend, or fused into a libtorch model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from merlin.dag import Node
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.schemas import describe_column


def top_k_items(
    scores: torch.Tensor,
    k: int,
    excluded_ids: torch.Tensor,
    seen_values: torch.Tensor | None = None,
    seen_offsets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and scores of the ``k`` highest-scoring items per row, best first.

    ``excluded_ids`` are never returned (padding and reserved ids); ``seen_values`` /
    ``seen_offsets`` (a ragged list per row; offsets may be ``None`` for a dense ``[rows, L]``
    list) name items each row has already seen, which are left out of that row. Ids outside the
    catalog are ignored. Ties keep torch.topk's order.
    """
    scores = scores.clone()
    rows, catalog = scores.shape[0], scores.shape[1]
    if excluded_ids.numel() > 0:
        scores[:, excluded_ids] = float("-inf")
    if seen_values is not None:
        if seen_offsets is None:
            length = seen_values.shape[1] if seen_values.dim() > 1 else 1
            row_of_value = torch.arange(rows).repeat_interleave(length)
            ids = seen_values.reshape(-1)
        else:
            lengths = (seen_offsets[1:] - seen_offsets[:-1]).to(torch.int64)
            row_of_value = torch.arange(rows).repeat_interleave(lengths)
            ids = seen_values
        inside = (ids >= 0) & (ids < catalog)
        scores[row_of_value[inside], ids[inside]] = float("-inf")
    best = torch.topk(scores, k, dim=1, largest=True, sorted=True)
    return best.indices, best.values


class TopK(ServingOperator):
    """Per row, the ``k`` best items of a ``[-1, catalog]`` score matrix: ids and scores ``[-1,
    k]``.

    Parameters
    ----------
    k
        How many items to return per row.
    scores
        The score column; by default the only float column of shape ``[-1, catalog]`` it receives.
    seen_items
        The session's item list, as a one-column selection of an upstream node (e.g.
        ``features["item_id-list"]``) or the name of a request column; items in it are not
        recommended again.
    exclude_ids
        Ids never to recommend, e.g. the padding and reserved ids of NVTabular's Categorify
        (``CategoryVocabulary.reserved_ids``).
    ids_column, scores_column
        Names of the two outputs.
    """

    def __init__(
        self,
        k: int,
        *,
        scores: str | None = None,
        seen_items: Node | str | None = None,
        exclude_ids: Sequence[int] = (),
        ids_column: str = "item_ids",
        scores_column: str = "item_scores",
    ):
        super().__init__()
        if int(k) < 1:
            raise ValueError(f"k must be at least 1, got {k!r}")
        self.k = int(k)
        self.scores_name = scores
        self.exclude_ids = sorted({int(i) for i in exclude_ids})
        self.ids_column = ids_column
        self.scores_column = scores_column
        self.seen_node = seen_items
        self.seen_column = _single_column(seen_items) if seen_items is not None else None

    @property
    def label(self) -> str:
        return f"TopK(k={self.k})"

    @property
    def dependencies(self):
        return [self.seen_node] if self.seen_node is not None else []

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        scores_name = self._scores_column(input_schema)
        expected = [input_schema[scores_name]]
        if self.seen_column is not None:
            seen = input_schema.get(self.seen_column)
            expected.append(
                seen
                if seen is not None
                else ColumnSchema(self.seen_column, dtype="int64", dims=(None, None))
            )
        return Schema(expected)

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        scores = input_schema[self._scores_column(input_schema)]
        dims = scores.shape.dims
        if (
            scores.dtype.element_type.value != "float"
            or dims is None
            or len(dims) != 2
            or dims[1].max is None
            or not dims[1].is_fixed
        ):
            raise SchemaError(
                self.label,
                scores.name,
                "float scores of shape [-1, catalog]",
                describe_column(scores),
            )
        catalog = int(dims[1].max)
        available = catalog - sum(1 for i in self.exclude_ids if 0 <= i < catalog)
        if self.k > available:
            raise SchemaError(
                self.label,
                scores.name,
                f"at least k={self.k} items to choose from",
                f"a catalog of {catalog} item(s) of which {available} may be recommended",
                "use a smaller k",
            )
        if self.seen_column is not None:
            seen = input_schema[self.seen_column]
            if seen.dtype.element_type.value != "int" or not seen.is_list:
                raise SchemaError(
                    self.label, seen.name, "an int list of item ids", describe_column(seen)
                )

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        scores = input_schema[self._scores_column(input_schema)]
        catalog = (
            scores.shape.dims[1].max if scores.shape.dims and len(scores.shape.dims) > 1 else None
        )
        id_properties = {"domain": {"min": 0, "max": int(catalog) - 1}} if catalog else {}
        return Schema(
            [
                ColumnSchema(
                    self.ids_column,
                    tags=[Tags.ITEM_ID],
                    properties=id_properties,
                    dtype="int64",
                    dims=(None, self.k),
                ),
                ColumnSchema(
                    self.scores_column, dtype=scores.dtype.without_shape, dims=(None, self.k)
                ),
            ]
        )

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        # the selector lists the expected input columns in order: scores first
        scores = transformable[self.scores_name or col_selector.names[0]].values
        seen_values = seen_offsets = None
        if self.seen_column is not None:
            seen = transformable[self.seen_column]
            seen_values = torch.from_numpy(np.asarray(seen.values).astype(np.int64, copy=False))
            if seen.offsets is not None:
                seen_offsets = torch.from_numpy(
                    np.asarray(seen.offsets).astype(np.int64, copy=False)
                )
        ids, best = top_k_items(
            torch.from_numpy(np.asarray(scores)),
            self.k,
            torch.tensor(self.exclude_ids, dtype=torch.int64),
            seen_values,
            seen_offsets,
        )
        return TensorTable(
            {self.ids_column: ids.numpy(), self.scores_column: best.numpy()}, _unsafe=True
        )

    def config(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "scores": self.scores_name,
            "seen_column": self.seen_column,
            "exclude_ids": self.exclude_ids,
            "ids_column": self.ids_column,
            "scores_column": self.scores_column,
        }

    @classmethod
    def load(cls, config: dict[str, Any], artifact_path: str) -> TopK:
        config = dict(config)
        seen_column = config.pop("seen_column")
        op = cls(**config)
        op.seen_column = seen_column
        return op

    # ---- helpers --------------------------------------------------------------------------------

    def _scores_column(self, input_schema: Schema) -> str:
        if self.scores_name is not None:
            if self.scores_name not in input_schema.column_names:
                raise SchemaError(
                    self.label,
                    self.scores_name,
                    "a float score column of shape [-1, catalog]",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
            return self.scores_name
        candidates = [
            c.name
            for c in input_schema
            if c.name != self.seen_column
            and c.dtype.element_type.value == "float"
            and c.shape.dims is not None
            and len(c.shape.dims) == 2
        ]
        if len(candidates) != 1:
            raise SchemaError(
                self.label,
                None,
                "exactly one float column of shape [-1, catalog] to rank",
                f"{len(candidates)} ({', '.join(map(repr, candidates)) or 'none'})",
                "name it with TopK(..., scores='column')",
            )
        return candidates[0]


def _single_column(source: Node | str) -> str:
    if isinstance(source, str):
        return source
    names = (
        source.selector.names if isinstance(source, Node) and source.selector is not None else []
    )
    if len(names) != 1:
        raise TypeError(
            "seen_items must select exactly one column, e.g. features['item_id-list'], "
            f"got {source!r}"
        )
    return names[0]
