"""Item retrieval for ``RetrieveTopK``: which index to build (``specs``), the exact block-wise
ranking (``exact``), and building, saving, loading and searching indexes (``indexes``)."""

from merlin_torch_serving.retrieval.indexes import ItemIndex
from merlin_torch_serving.retrieval.specs import ExactIndex, HNSWIndex, IVFIndex

__all__ = ["ExactIndex", "HNSWIndex", "IVFIndex", "ItemIndex"]
