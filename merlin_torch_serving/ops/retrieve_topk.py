"""RetrieveTopK: the k best items per session from an item index, queried with the session's vector.

A next-item model scores its catalog as the session's vector times an item table. Scoring every
item costs linearly in the catalog (38 ms for one session at a million items on one core); an
inner-product index over the table answers the same question in a millisecond, up to the index's
approximation. The index is built once (when the ensemble first runs or is exported), saved with
the step, and loaded once by each model instance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from merlin.dag import Node
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data.schemas import describe_column
from merlin_torch_serving.exceptions import SchemaError
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.topk import (
    check_seen_items,
    ranked_items_schema,
    seen_tensors,
    set_selection,
    with_seen_items,
)
from merlin_torch_serving.retrieval.indexes import ItemIndex, build_index, load_index
from merlin_torch_serving.retrieval.specs import IndexSpec, index_spec, to_config

logger = logging.getLogger("merlin_torch_serving")


class RetrieveTopK(ServingOperator):
    """Per row, the ``k`` items whose vectors have the highest inner product with the row's query
    vector: ids and scores ``[-1, k]``, as ``TopK`` returns them (``DecodeItemIds`` follows).

    Parameters
    ----------
    k
        How many items to return per row.
    item_vectors
        The items: a ``[catalog, d]`` array or tensor (row ``i`` is item id ``i``), a
        Transformers4Rec next-item model (its item table and softmax temperature, as it scores
        its catalog; pair it with ``PredictPytorch(model, output="session_embedding")``), or an
        ``ItemIndex`` built or loaded before.
    index
        What to build over the vectors: ``ExactIndex()`` (every item scored, the model's own
        answer; the default), ``HNSWIndex(m, ef_construction, ef_search)`` or ``IVFIndex(lists,
        probes, codes, rerank)`` (faiss, approximate; ``codes="sq8"`` scans 8-bit codes and
        re-ranks exactly), or their names ``"exact"``, ``"hnsw"``, ``"ivf"``.
    query
        The query column, float ``[-1, d]``; by default the only such column it receives.
    seen_items, exclude_ids
        As for ``TopK``: the session's item list (items in it are not recommended again) and ids
        never to recommend (Categorify's padding and reserved ids).
    temperature
        Scores are inner products divided by it (Transformers4Rec's ``softmax_temperature``);
        taken from a Transformers4Rec model, else ``None`` (no division).
    ids_column, scores_column
        Names of the two outputs.
    """

    def __init__(
        self,
        k: int,
        item_vectors,
        *,
        index: IndexSpec | str | dict | None = None,
        query: str | None = None,
        seen_items: Node | str | None = None,
        exclude_ids: Sequence[int] = (),
        temperature: float | None = None,
        ids_column: str = "item_ids",
        scores_column: str = "item_scores",
    ):
        super().__init__()
        set_selection(self, k, seen_items, exclude_ids, ids_column, scores_column)
        self.query_name = query
        self._index: ItemIndex | None = None
        if isinstance(item_vectors, ItemIndex):
            self._index = item_vectors
            self.index_spec = item_vectors.spec
            self.catalog_size, self.dimension = item_vectors.catalog_size, item_vectors.dimension
        else:
            vectors, temperature = _vectors_and_temperature(item_vectors, temperature)
            self.item_vectors = vectors
            self.index_spec = index_spec(index if index is not None else "exact")
            self.catalog_size, self.dimension = (int(n) for n in vectors.shape)
        if temperature is not None and not temperature > 0:
            raise ValueError(f"temperature must be above 0 (or None), got {temperature!r}")
        self.temperature = None if temperature is None else float(temperature)
        available = self.catalog_size - sum(
            1 for i in self.exclude_ids if 0 <= i < self.catalog_size
        )
        if self.k > available:
            raise ValueError(
                f"k={self.k} is more than the {available} item(s) of the catalog that may be"
                " recommended"
            )

    @property
    def label(self) -> str:
        return f"RetrieveTopK(k={self.k}, {self.index_spec.kind})"

    @property
    def dependencies(self):
        return [self.seen_node] if self.seen_node is not None else []

    @property
    def item_index(self) -> ItemIndex:
        """The index, built on first use (running the ensemble, or exporting it)."""
        if self._index is None:
            began = time.perf_counter()
            self._index = build_index(self.index_spec, self.item_vectors, self.exclude_ids)
            logger.info(
                "RetrieveTopK: %s index over %d items of dimension %d built in %.1f s",
                self.index_spec.kind,
                self.catalog_size,
                self.dimension,
                time.perf_counter() - began,
            )
        return self._index

    # ---- schemas ---------------------------------------------------------------------------

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return with_seen_items(
            input_schema[self._query_column(input_schema)], input_schema, self.seen_column
        )

    def validate_schemas(
        self, parents_schema, deps_schema, input_schema, output_schema, strict_dtypes=False
    ):
        query = input_schema[self._query_column(input_schema)]
        dims = query.shape.dims
        if (
            query.dtype.element_type.value != "float"
            or dims is None
            or len(dims) != 2
            or dims[1].max != self.dimension
        ):
            raise SchemaError(
                self.label,
                query.name,
                f"float query vectors of shape [-1, {self.dimension}] (the item vectors'"
                " dimension)",
                describe_column(query),
            )
        if self.seen_column is not None:
            check_seen_items(self.label, input_schema[self.seen_column])

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return ranked_items_schema(
            self.k, self.catalog_size, np.float32, self.ids_column, self.scores_column
        )

    # ---- running -----------------------------------------------------------------------------

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        # the selector lists the expected input columns in order: the query first
        queries = torch.from_numpy(
            np.ascontiguousarray(transformable[col_selector.names[0]].values, dtype=np.float32)
        )
        seen_values, seen_offsets = seen_tensors(transformable, self.seen_column)
        with torch.inference_mode():
            ids, scores = self.item_index.search(
                queries,
                self.k,
                torch.tensor(self.exclude_ids, dtype=torch.int64),
                seen_values,
                seen_offsets,
                self.temperature or 0.0,
            )
        return TensorTable(
            {self.ids_column: ids.numpy(), self.scores_column: scores.numpy()}, _unsafe=True
        )

    # ---- export ------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "index": to_config(self.index_spec),
            "catalog_size": self.catalog_size,
            "query": self.query_name,
            "seen_items": self.seen_column,
            "exclude_ids": self.exclude_ids,
            "temperature": self.temperature,
            "ids_column": self.ids_column,
            "scores_column": self.scores_column,
        }

    def save_artifacts(self, artifact_path=None) -> None:
        self.item_index.save(artifact_path)

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        """The saved index stands in for the item vectors (``__init__`` takes either)."""
        arguments = dict(config)
        spec = index_spec(arguments.pop("index"))
        arguments["item_vectors"] = load_index(spec, artifact_path, arguments.pop("catalog_size"))
        return arguments

    # ---- helpers -----------------------------------------------------------------------------

    def _query_column(self, input_schema: Schema) -> str:
        if self.query_name is not None:
            if self.query_name not in input_schema.column_names:
                raise SchemaError(
                    self.label,
                    self.query_name,
                    f"float query vectors of shape [-1, {self.dimension}]",
                    "no such column (it receives"
                    f" {', '.join(map(repr, input_schema.column_names))})",
                )
            return self.query_name
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
                f"exactly one float column of shape [-1, {self.dimension}] to query the index with",
                f"{len(candidates)} ({', '.join(map(repr, candidates)) or 'none'})",
                "name it with RetrieveTopK(..., query='column')",
            )
        return candidates[0]


def _vectors_and_temperature(
    item_vectors, temperature: float | None
) -> tuple[torch.Tensor, float | None]:
    """The ``[catalog, d]`` float32 tensor of item vectors, and the temperature to divide by."""
    if isinstance(item_vectors, torch.nn.Module):
        from merlin_torch_serving.model_prep.next_item import next_item_scoring

        scoring = next_item_scoring(item_vectors)
        if (
            temperature is not None
            and scoring.temperature is not None
            and temperature != scoring.temperature
        ):
            raise ValueError(
                f"temperature={temperature} differs from the model's softmax_temperature"
                f" ({scoring.temperature}); leave temperature out to rank and score as the model"
                " does"
            )
        return scoring.item_vectors, scoring.temperature if temperature is None else temperature
    vectors = torch.as_tensor(
        np.asarray(item_vectors) if not isinstance(item_vectors, torch.Tensor) else item_vectors
    )
    if vectors.dim() != 2 or not vectors.is_floating_point() or vectors.shape[0] == 0:
        raise ValueError(
            "item_vectors must be a float [catalog, d] array or tensor (row i is item id i), a"
            f" Transformers4Rec next-item model, or an ItemIndex; got {type(item_vectors).__name__}"
            f" of shape {tuple(vectors.shape)}"
        )
    return vectors.detach().to(torch.float32), temperature
