"""The kinds of item index ``RetrieveTopK`` can build, each with its accuracy knobs.

Each kind is a small frozen dataclass: what is built is decided when the ensemble is built, and
the same description goes into the export (``to_config`` / ``index_spec``) so a served step loads
exactly the index that was built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from merlin_torch_serving.retrieval.exact import DEFAULT_BLOCK_ITEMS


@dataclass(frozen=True)
class ExactIndex:
    """Every item scored, a block at a time (what faiss calls a Flat index): the model's own
    ranking and scores; cost linear in the catalog. Needs nothing beyond torch."""

    #: items scored per block (see ``retrieval.exact``); changes speed, never the answer
    block_items: int = DEFAULT_BLOCK_ITEMS

    kind = "exact"

    def __post_init__(self):
        _check_positive(self)


@dataclass(frozen=True)
class HNSWIndex:
    """A faiss HNSW graph over the item vectors, searched by inner product: query time grows with
    the log of the catalog. Recall rises with ``m``, ``ef_construction`` and ``ef_search``."""

    #: links per item in the graph; more: better recall, more memory (``8 * m`` bytes per item)
    #: and a slower build
    m: int = 32
    #: candidates kept while the graph is built; more: a better graph, a slower build
    ef_construction: int = 128
    #: candidates kept while searching: the recall / latency knob (raised to the number of
    #: results fetched when that is larger)
    ef_search: int = 512

    kind = "hnsw"

    def __post_init__(self):
        _check_positive(self)


#: how an IVF index stores its vectors: ``"flat"`` float32 as given; ``"sq8"`` one byte per
#: dimension (faiss' 8-bit scalar quantizer), scanned in a quarter of the memory traffic, the
#: best candidates then re-ranked against the float vectors
IVF_CODES = ("flat", "sq8")


@dataclass(frozen=True)
class IVFIndex:
    """A faiss inverted-file index: items clustered into ``lists`` by k-means, a query scores the
    items of its ``probes`` nearest lists. Builds in seconds; needs vectors that cluster (trained
    embeddings do; random ones do not) to reach a high recall with few probes.

    Scanning the probed lists is memory-bound; ``codes="sq8"`` scans one byte per dimension
    instead of four and re-ranks the best ``rerank * k`` candidates by their exact inner
    products, so scores and order among those are the model's own (the index holds both the
    codes and the float vectors: about 1.25 times the table)."""

    #: k-means clusters; about ``4 * sqrt(catalog)`` is usual
    lists: int = 1024
    #: clusters scored per query: the recall / latency knob
    probes: int = 32
    #: ``"flat"`` or ``"sq8"`` (see ``IVF_CODES``)
    codes: str = "flat"
    #: with ``"sq8"``: candidates re-ranked exactly per result wanted (unused with ``"flat"``)
    rerank: int = 4

    kind = "ivf"

    def __post_init__(self):
        if self.codes not in IVF_CODES:
            raise ValueError(
                f"IVFIndex.codes must be one of {', '.join(map(repr, IVF_CODES))}, got"
                f" {self.codes!r}"
            )
        _check_positive(self, skip=("codes",))


IndexSpec = ExactIndex | HNSWIndex | IVFIndex
_KINDS = {spec.kind: spec for spec in (ExactIndex, HNSWIndex, IVFIndex)}


def index_spec(value: IndexSpec | str | dict[str, Any]) -> IndexSpec:
    """An index description from a spec, a kind name with default knobs (``"exact"``, ``"hnsw"``,
    ``"ivf"``), or a ``to_config`` dict."""
    if isinstance(value, (ExactIndex, HNSWIndex, IVFIndex)):
        return value
    config: object = {"kind": value} if isinstance(value, str) else value
    if isinstance(config, dict) and config.get("kind") in _KINDS:
        knobs = {name: item for name, item in config.items() if name != "kind"}
        return _KINDS[config["kind"]](**knobs)
    kinds = ", ".join(repr(kind) for kind in _KINDS)
    raise ValueError(
        f"index must be ExactIndex(), HNSWIndex(...), IVFIndex(...) or one of {kinds}, got"
        f" {value!r}"
    )


def to_config(spec: IndexSpec) -> dict[str, Any]:
    """JSON-able description that ``index_spec`` reads back."""
    return {"kind": spec.kind, **dataclasses.asdict(spec)}


def _check_positive(spec, skip: tuple[str, ...] = ()) -> None:
    for field in dataclasses.fields(spec):
        if field.name in skip:
            continue
        value = getattr(spec, field.name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(
                f"{type(spec).__name__}.{field.name} must be a positive integer, got {value!r}"
            )
