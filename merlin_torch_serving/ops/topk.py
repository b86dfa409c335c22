"""TopK: the k best items per row over the whole catalog's scores, with exclusions.

The selection is a TorchScript function, so the same kernel runs in-process, in the python backend,
and compiled into the libtorch model whose scores it ranks (``TopK.torchscript``).
"""

# no `from __future__ import annotations`: TorchScript reads the class annotations below as types
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from merlin.dag import Node
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving.aot import exportable
from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.live.rules import BlockList
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.retrieval.exact import seen_pairs
from merlin_torch_serving.retrieval.selection import best_of_rows


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
    catalog are ignored. A row left with fewer than ``k`` items gets excluded ids scored -inf in
    the remaining places.

    The scores are read once and never copied: each row's ``k`` plus as many more best items as
    it may have to leave out are selected (``best_of_rows``), and the first ``k`` it may keep are
    returned (a copy of the whole ``[rows, catalog]`` matrix to mask it cost as much as the
    selection itself).
    """
    rows, catalog = scores.shape[0], scores.shape[1]
    seen_rows, seen_ids = seen_pairs(rows, seen_values, seen_offsets)
    inside = (seen_ids >= 0) & (seen_ids < catalog)
    seen_rows, seen_ids = seen_rows[inside], seen_ids[inside]
    exporting = False
    fetched = catalog
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript must not compile the inside)
        if torch.compiler.is_exporting():  # a package reads the count without branching on it
            exporting = True
            fetched = exportable.fetched_count(seen_rows, rows, k + excluded_ids.numel(), catalog)
    if not exporting:
        most_seen = (
            int(torch.bincount(seen_rows, minlength=rows).max()) if seen_rows.numel() > 0 else 0
        )
        fetched = min(k + excluded_ids.numel() + most_seen, catalog)
    best_values, best_ids = best_of_rows(scores, fetched)
    refused = torch.isin(best_ids, excluded_ids)
    if exporting or seen_rows.numel() > 0:
        matches = (best_ids[seen_rows] == seen_ids.unsqueeze(1)).to(torch.int32)
        seen_counts = torch.zeros((rows, fetched), dtype=torch.int32).index_add_(
            0, seen_rows, matches
        )
        refused = refused | (seen_counts > 0)
    order = torch.argsort(refused.to(torch.int32), dim=1, stable=True)[:, :k]
    values = torch.gather(best_values, 1, order)
    values = torch.where(
        torch.gather(refused, 1, order), torch.full_like(values, float("-inf")), values
    )
    return torch.gather(best_ids, 1, order), values


class TopKSelection(torch.nn.Module):
    """``top_k_items`` over wire tensors: the ``scores`` input ranked, leaving out ``excluded_ids``
    and the items of the ``seen`` input (``""`` for none; a ragged one arrives as values and
    offsets). Returns ids and scores, TopK's outputs in order."""

    k: int
    scores: str
    seen: str
    seen_ragged: bool
    excluded_ids: torch.Tensor

    def __init__(
        self, k: int, excluded_ids: Sequence[int], scores: str, seen: str, seen_ragged: bool
    ):
        super().__init__()
        self.k = k
        self.scores = scores
        self.seen = seen
        self.seen_ragged = seen_ragged
        self.register_buffer("excluded_ids", torch.tensor(list(excluded_ids), dtype=torch.int64))

    def forward(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        seen_values: torch.Tensor | None = None
        seen_offsets: torch.Tensor | None = None
        if self.seen != "":
            if self.seen_ragged:
                seen_values = inputs[self.seen + wire.VALUES_SUFFIX].to(torch.int64)
                seen_offsets = inputs[self.seen + wire.OFFSETS_SUFFIX].to(torch.int64)
            else:
                seen_values = inputs[self.seen].to(torch.int64)
        return top_k_items(
            inputs[self.scores], self.k, self.excluded_ids, seen_values, seen_offsets
        )


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
    block_list
        A ``BlockList`` kept in a store: ids never to recommend that change while the graph serves
        (a TopK with one runs on the python backend, not compiled into the model before it).
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
        block_list: BlockList | None = None,
    ):
        super().__init__()
        set_selection(self, k, seen_items, exclude_ids, ids_column, scores_column)
        self.scores_name = scores
        self.block_list = block_list

    @property
    def label(self) -> str:
        return f"TopK(k={self.k})"

    @property
    def dependencies(self):
        return [self.seen_node] if self.seen_node is not None else []

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return with_seen_items(
            input_schema[self._scores_column(input_schema)], input_schema, self.seen_column
        )

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
            check_seen_items(self.label, input_schema[self.seen_column])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        scores = input_schema[self._scores_column(input_schema)]
        catalog = (
            scores.shape.dims[1].max if scores.shape.dims and len(scores.shape.dims) > 1 else None
        )
        return ranked_items_schema(
            self.k, catalog, scores.dtype.without_shape, self.ids_column, self.scores_column
        )

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        # the selector lists the expected input columns in order: scores first
        scores = transformable[self.scores_name or col_selector.names[0]].values
        seen_values, seen_offsets = seen_tensors(transformable, self.seen_column)
        excluded = torch.tensor(self.exclude_ids, dtype=torch.int64)
        if self.block_list is not None:
            excluded = torch.unique(torch.cat([excluded, torch.from_numpy(self.block_list.ids())]))
        ids, best = top_k_items(
            torch.from_numpy(np.asarray(scores)), self.k, excluded, seen_values, seen_offsets
        )
        return TensorTable(
            {self.ids_column: ids.numpy(), self.scores_column: best.numpy()}, _unsafe=True
        )

    def config(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "scores": self.scores_name,
            # loaded on its own, the operator takes the seen items as an input column of that name
            "seen_items": self.seen_column,
            "exclude_ids": self.exclude_ids,
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

    def torchscript(self, input_schema: Schema) -> TopKSelection | None:
        if self.block_list is not None:
            return None  # the list is read from a store while serving
        seen = self.seen_column or ""
        ragged = bool(seen) and wire.is_ragged(input_schema[seen])
        return TopKSelection(
            self.k, self.exclude_ids, self._scores_column(input_schema), seen, ragged
        )

    def exportable(self, input_schema: Schema) -> TopKSelection | None:
        return self.torchscript(input_schema)

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


def single_column(source: Node | str) -> str:
    """The one column name a ``seen_items`` argument selects (a node's single column, or a name)."""
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


def with_seen_items(first: ColumnSchema, input_schema: Schema, seen_column: str | None) -> Schema:
    """``first`` and, when the operator has one, its seen-items column (as the input has it, else
    the int64 list of ids the operator expects there)."""
    if seen_column is None:
        return Schema([first])
    seen = input_schema.get(seen_column)
    if seen is None:
        seen = ColumnSchema(seen_column, dtype="int64", dims=(None, None))
    return Schema([first, seen])


def check_seen_items(label: str, seen: ColumnSchema) -> None:
    """A ``SchemaError`` unless ``seen`` is an int list of item ids."""
    if seen.dtype.element_type.value != "int" or not seen.is_list:
        raise SchemaError(label, seen.name, "an int list of item ids", describe_column(seen))


def ranked_items_schema(
    k: int, catalog: int | None, scores_dtype, ids_column: str, scores_column: str
) -> Schema:
    """The two outputs of a top-k selection: item ids (in the catalog's domain) and their scores."""
    id_properties = {"domain": {"min": 0, "max": int(catalog) - 1}} if catalog else {}
    return Schema(
        [
            ColumnSchema(
                ids_column,
                tags=[Tags.ITEM_ID],
                properties=id_properties,
                dtype="int64",
                dims=(None, k),
            ),
            ColumnSchema(scores_column, dtype=scores_dtype, dims=(None, k)),
        ]
    )


def seen_tensors(
    table: TensorTable, seen_column: str | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The seen items' values and offsets (``None`` for a dense list, or for no column) as int64."""
    if seen_column is None:
        return None, None
    seen = table[seen_column]
    values = torch.from_numpy(np.asarray(seen.values).astype(np.int64, copy=False))
    offsets = (
        None
        if seen.offsets is None
        else torch.from_numpy(np.asarray(seen.offsets).astype(np.int64, copy=False))
    )
    return values, offsets


def set_selection(op, k, seen_items, exclude_ids, ids_column, scores_column) -> None:
    """The settings every top-k selector shares (TopK, RetrieveTopK), checked and set on ``op``."""
    if int(k) < 1:
        raise ValueError(f"k must be at least 1, got {k!r}")
    op.k = int(k)
    op.exclude_ids = sorted({int(i) for i in exclude_ids})
    op.ids_column = ids_column
    op.scores_column = scores_column
    op.seen_node = seen_items
    op.seen_column = single_column(seen_items) if seen_items is not None else None
