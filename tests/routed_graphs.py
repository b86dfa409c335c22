"""A routed toy graph for the routing tests: sessions the workflow filters out, or whose items are
all unknown, go to the most popular items (a dropped session with its own clicks: the workflow
computes it without its filters); the others to one of two copies of the toy model by an
experiment (the candidate on libtorch when asked); the popular items, computed in the route's own
step when served, answer a failed branch."""

from __future__ import annotations

from merlin_torch_serving import (
    AllItemsUnknown,
    DecodeItemIds,
    Experiment,
    FilteredOut,
    ItemPopularity,
    MostPopular,
    PredictPytorch,
    Route,
    TopK,
    TransformWorkflow,
)
from tests import toy_session

K = 3
EXPERIMENT = "toy-test"


def ranked(features, workflow, model, backend: str = "python"):
    """The toy model's top K raw item ids, as an unrouted graph ranks them."""
    scripted, input_schema, output_schema = model
    return (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend=backend)
        >> TopK(K, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
        >> DecodeItemIds(workflow)
    )


def popularity(workflow):
    return ItemPopularity.fit(toy_session.interactions(), workflow)


def routed(
    workflow,
    model,
    *,
    weights=None,
    candidate_backend: str = "python",
    fallback: str | None = "popular",
    inline=("popular",),
    features=None,
):
    """``features``: the workflow's node to build on (made here by default)."""
    features = features or workflow.input_schema.column_names >> TransformWorkflow(
        workflow, filtered_sessions="unfiltered"
    )
    popular = features >> MostPopular(popularity(workflow), K) >> DecodeItemIds(workflow)
    return features >> Route(
        {
            "current": ranked(features, workflow, model),
            "candidate": ranked(features, workflow, model, candidate_backend),
            "popular": popular,
        },
        rules=[(FilteredOut(), "popular"), (AllItemsUnknown(), "popular")],
        default=Experiment(EXPERIMENT, weights or {"current": 0.5, "candidate": 0.5}),
        fallback=fallback,
        inline=inline,
    )
