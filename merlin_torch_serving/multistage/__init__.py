"""Multi-stage recommendations: the operators that take a session from a retrieved set of candidates
to its ordered answer, in one served ensemble.

    RetrieveTopK(200, ...)            candidates per session, from an item index
    >> FilterCandidates(...)          the index's padding, the session's own items, a block list out
    >> UnrollCandidates(...)          one row per (session, candidate), session columns repeated
    >> LookupFeatures / FeastFeatures features of each candidate (an exported table, or Feast)
    >> PredictPytorch(ranker)         a score per (session, candidate) row
    >> TopKCandidates / SoftmaxSampling  back to one row per session: the k best, or a sample

Each operator is one module over the contract of ``ops.base``.
"""

from merlin_torch_serving.multistage.candidates import FilterCandidates
from merlin_torch_serving.multistage.feast_lookup import FeastFeatures
from merlin_torch_serving.multistage.softmax_sampling import SoftmaxSampling
from merlin_torch_serving.multistage.table_lookup import LookupFeatures
from merlin_torch_serving.multistage.top_candidates import TopKCandidates
from merlin_torch_serving.multistage.unroll import UnrollCandidates

__all__ = [
    "FeastFeatures",
    "FilterCandidates",
    "LookupFeatures",
    "SoftmaxSampling",
    "TopKCandidates",
    "UnrollCandidates",
]
