"""Routing: every session of a request answered by the branch (sub-graph) that fits it.

``Route`` sends each session to a branch by rules (``FilteredOut``, ``FewerKnownItems``,
``AllItemsUnknown``, ``Predicate``), by an ``Experiment``'s weights, or by default, and merges the
answers; ``MostPopular`` over an ``ItemPopularity`` is the fallback that answers any session;
``set_weights`` changes an experiment's weights in an exported repository or on a running server
without a new export.
"""

from merlin_torch_serving.routing.conditions import (
    AllItemsUnknown,
    Condition,
    FewerKnownItems,
    FilteredOut,
    Predicate,
)
from merlin_torch_serving.routing.experiment import Experiment, session_buckets
from merlin_torch_serving.routing.most_popular import MostPopular
from merlin_torch_serving.routing.popularity import ItemPopularity
from merlin_torch_serving.routing.route import Route
from merlin_torch_serving.routing.weights import set_weights, weights_of

__all__ = [
    "AllItemsUnknown",
    "Condition",
    "Experiment",
    "FewerKnownItems",
    "FilteredOut",
    "ItemPopularity",
    "MostPopular",
    "Predicate",
    "Route",
    "session_buckets",
    "set_weights",
    "weights_of",
]
