"""Item indexes as ``RetrieveTopK`` uses them: built from the item vectors, saved into a step's
artifacts, loaded by each model instance, and searched for a batch of session vectors with every
row's exclusions applied.

``ExactItems`` ranks with ``retrieval.exact`` (torch only). ``FaissItems`` searches a faiss index
(faiss-cpu, an optional dependency: ``pip install 'merlin-torch-serving[retrieval]'``); excluded
ids are left out of the index when it is built, and a row's seen items by fetching as many more
candidates as the row has seen items and dropping those.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod

import numpy as np
import torch

from merlin_torch_serving.retrieval.exact import exact_top_k
from merlin_torch_serving.retrieval.specs import ExactIndex, HNSWIndex, IndexSpec, IVFIndex
from merlin_torch_serving.tensors.huge_pages import collapse_onto_huge_pages

logger = logging.getLogger("merlin_torch_serving")

EXACT_FILE = "item_vectors.npy"
FAISS_FILE = "items.faiss"
_ADD_BATCH = 100_000  # items added per call while building, so long builds show progress
_IVF_TRAINING_POINTS_PER_LIST = 64
# Below this many items a build takes seconds on one core, and a second thread mostly waits for a
# core on a busy machine (measured: 5,000 items built 2 to 30 times slower on 2 threads).
_PARALLEL_BUILD_ITEMS = 100_000


class ItemIndex(ABC):
    """A searchable set of item vectors ``[catalog, dimension]``; row ``i`` is item id ``i``."""

    spec: IndexSpec
    catalog_size: int
    dimension: int

    @abstractmethod
    def search(
        self,
        queries: torch.Tensor,
        k: int,
        excluded_ids: torch.Tensor,
        seen_values: torch.Tensor | None,
        seen_offsets: torch.Tensor | None,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query row, the ``k`` best item ids (int64) and their scores (inner products, divided
        by ``temperature`` when above 0), best first; -1 and -inf where fewer were found."""

    @abstractmethod
    def save(self, directory: str) -> None:
        """Write the index into ``directory``."""


def build_index(spec: IndexSpec, item_vectors: torch.Tensor, excluded_ids: list[int]) -> ItemIndex:
    """The index ``spec`` describes over ``item_vectors`` (never returning ``excluded_ids``)."""
    if isinstance(spec, ExactIndex):
        return ExactItems(spec, item_vectors)
    return FaissItems.build(spec, item_vectors, excluded_ids)


def load_index(spec: IndexSpec, directory: str, catalog_size: int) -> ItemIndex:
    """The index ``build_index`` made and ``save`` wrote into ``directory``."""
    if isinstance(spec, ExactIndex):
        return ExactItems(spec, torch.from_numpy(np.load(os.path.join(directory, EXACT_FILE))))
    return FaissItems(spec, _faiss().read_index(os.path.join(directory, FAISS_FILE)), catalog_size)


class ExactItems(ItemIndex):
    """Every item scored (``retrieval.exact``): the model's own ranking."""

    spec: ExactIndex

    def __init__(self, spec: ExactIndex, item_vectors: torch.Tensor):
        self.spec = spec
        self.item_vectors = item_vectors.detach().to(torch.float32).contiguous()
        collapse_onto_huge_pages([self.item_vectors])
        self.catalog_size, self.dimension = self.item_vectors.shape

    def search(self, queries, k, excluded_ids, seen_values, seen_offsets, temperature):
        return exact_top_k(
            queries,
            self.item_vectors,
            k,
            excluded_ids,
            seen_values,
            seen_offsets,
            temperature,
            self.spec.block_items,
        )

    def save(self, directory: str) -> None:
        np.save(os.path.join(directory, EXACT_FILE), self.item_vectors.numpy())


class FaissItems(ItemIndex):
    """A faiss index of the recommendable items, searched by inner product.

    The items' ids are their faiss ids.
    """

    def __init__(self, spec: HNSWIndex | IVFIndex, index, catalog_size: int):
        self.spec = spec
        self.index = index
        self.catalog_size = int(catalog_size)
        self.dimension = int(index.d)
        self.parameters = _search_parameters(spec)

    @classmethod
    def build(
        cls, spec: HNSWIndex | IVFIndex, item_vectors: torch.Tensor, excluded_ids: list[int]
    ) -> FaissItems:
        faiss = _faiss()
        vectors = np.ascontiguousarray(item_vectors.detach().to(torch.float32).numpy())
        catalog, _dimension = vectors.shape
        ids = np.setdiff1d(
            np.arange(catalog, dtype=np.int64), np.asarray(excluded_ids, dtype=np.int64)
        )
        began = time.perf_counter()
        # faiss shares torch's OpenMP runtime: its thread count is torch's, so it is put back after
        # (else torch reports that count while MKL keeps its own, and products change their bits)
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads((os.cpu_count() or 1) if len(ids) >= _PARALLEL_BUILD_ITEMS else 1)
        try:
            index = cls._built(faiss, spec, vectors, ids, began)
        finally:
            faiss.omp_set_num_threads(threads)
        return cls(spec, index, catalog)

    @staticmethod
    def _built(
        faiss, spec: HNSWIndex | IVFIndex, vectors: np.ndarray, ids: np.ndarray, began: float
    ):
        """The faiss index of ``spec`` over the ``ids`` rows of ``vectors``."""
        dimension = vectors.shape[1]
        if isinstance(spec, HNSWIndex):
            inner = faiss.IndexHNSWFlat(dimension, spec.m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efConstruction = spec.ef_construction
        else:
            inner = _ivf(faiss, spec, dimension, min(spec.lists, len(ids)))
            training = np.random.default_rng(0).permutation(ids)[
                : inner.nlist * _IVF_TRAINING_POINTS_PER_LIST
            ]
            inner.train(vectors[np.sort(training)])
            if spec.codes == "sq8":  # the float vectors kept beside the codes, for the re-rank
                inner = faiss.IndexRefineFlat(inner)
        index = faiss.IndexIDMap(inner)
        for start in range(0, len(ids), _ADD_BATCH):
            batch = ids[start : start + _ADD_BATCH]
            index.add_with_ids(vectors[batch], batch)
            if len(ids) > _ADD_BATCH:
                logger.info(
                    "RetrieveTopK: %s index: %d of %d items added (%.0f s)",
                    spec.kind,
                    start + len(batch),
                    len(ids),
                    time.perf_counter() - began,
                )
        return index

    def search(self, queries, k, excluded_ids, seen_values, seen_offsets, temperature):
        queries = np.ascontiguousarray(queries.detach().to(torch.float32).numpy())
        seen = _seen_matrix(queries.shape[0], seen_values, seen_offsets)
        fetch = min(k + seen.shape[1], self.index.ntotal)
        faiss = _faiss()
        # one search thread per torch thread: the step's thread budget (ModelOptions.torch_threads)
        faiss.omp_set_num_threads(torch.get_num_threads())
        parameters = self.parameters
        if isinstance(self.spec, HNSWIndex) and fetch > self.spec.ef_search:
            parameters = faiss.SearchParametersHNSW(efSearch=fetch)
        scores, ids = self.index.search(queries, fetch, params=parameters)
        ids, scores = _first_allowed(ids, scores, k, seen, excluded_ids.numpy())
        if temperature > 0.0:
            scores = scores / np.float32(temperature)
        return torch.from_numpy(ids), torch.from_numpy(scores)

    def save(self, directory: str) -> None:
        _faiss().write_index(self.index, os.path.join(directory, FAISS_FILE))


def _ivf(faiss, spec: IVFIndex, dimension: int, lists: int):
    """An untrained IVF index of ``spec``'s codes over ``lists`` clusters, by inner product."""
    quantizer = faiss.IndexFlatIP(dimension)
    if spec.codes == "sq8":
        return faiss.IndexIVFScalarQuantizer(
            quantizer, dimension, lists, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
    return faiss.IndexIVFFlat(quantizer, dimension, lists, faiss.METRIC_INNER_PRODUCT)


def _search_parameters(spec: HNSWIndex | IVFIndex):
    """faiss' search parameters for ``spec``'s knobs."""
    faiss = _faiss()
    if isinstance(spec, HNSWIndex):
        return faiss.SearchParametersHNSW(efSearch=spec.ef_search)
    probing = faiss.SearchParametersIVF(nprobe=spec.probes)
    if spec.codes == "flat":
        return probing
    # faiss' wrapper keeps the nested parameters alive as long as the outer ones
    return faiss.IndexRefineSearchParameters(k_factor=float(spec.rerank), base_index_params=probing)


def _seen_matrix(
    rows: int, values: torch.Tensor | None, offsets: torch.Tensor | None
) -> np.ndarray:
    """Each row's seen ids as a dense ``[rows, longest]`` int64 matrix padded with -1."""
    if values is None:
        return np.full((rows, 0), -1, dtype=np.int64)
    seen = values.numpy().astype(np.int64, copy=False)
    if offsets is None:
        return seen.reshape(rows, -1)
    row_offsets = offsets.numpy().astype(np.int64, copy=False)
    lengths = np.diff(row_offsets)
    dense = np.full((rows, int(lengths.max(initial=0))), -1, dtype=np.int64)
    columns = np.arange(len(seen)) - np.repeat(row_offsets[:-1], lengths)
    dense[np.repeat(np.arange(rows), lengths), columns] = seen
    return dense


def _first_allowed(
    ids: np.ndarray, scores: np.ndarray, k: int, seen: np.ndarray, excluded: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` candidates of each row that are found (id >= 0), not seen by the row and not
    excluded, in the order found; -1 and -inf fill rows with fewer."""
    refused = (ids < 0) | np.isin(ids, excluded)
    if seen.shape[1]:
        refused |= (ids[:, :, None] == seen[:, None, :]).any(axis=2)
    order = np.argsort(refused, axis=1, kind="stable")[:, :k]
    kept_ids = np.take_along_axis(ids, order, axis=1)
    kept_scores = np.take_along_axis(scores, order, axis=1)
    missing = np.take_along_axis(refused, order, axis=1)
    if kept_ids.shape[1] < k:  # the index holds fewer than k items
        pad = k - kept_ids.shape[1]
        kept_ids = np.pad(kept_ids, ((0, 0), (0, pad)))
        kept_scores = np.pad(kept_scores, ((0, 0), (0, pad)))
        missing = np.pad(missing, ((0, 0), (0, pad)), constant_values=True)
    return np.where(missing, -1, kept_ids), np.where(
        missing, np.float32(-np.inf), kept_scores
    ).astype(np.float32)


def _faiss():
    try:
        import faiss
    except ImportError as error:
        raise ImportError(
            "approximate item indexes (HNSWIndex, IVFIndex) need faiss-cpu: pip install "
            "'merlin-torch-serving[retrieval]' (ExactIndex needs only torch)"
        ) from error
    return faiss
