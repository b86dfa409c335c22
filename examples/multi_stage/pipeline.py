"""The example's serving graph: raw clicks in, per session its 10 best raw item ids out, in five
stages: retrieve (the session model's encoder and an item index), filter, look up features (Feast,
or a table exported with the repository), rank (the ranker on every (session, candidate) row),
order (top-k, or a softmax sample).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from examples.multi_stage import ranker as ranking
from examples.multi_stage.feature_store import (
    ITEM_FEATURES,
    ITEM_VIEW,
    SESSION_FEATURES,
    SESSION_VIEW,
)
from examples.session_based.features import CATEGORY_LIST_COLUMN, ITEM_LIST_COLUMN
from merlin_torch_serving import (
    DecodeItemIds,
    ExactIndex,
    PredictPytorch,
    RetrieveTopK,
    TransformWorkflow,
)
from merlin_torch_serving.multistage import (
    FeastFeatures,
    FilterCandidates,
    LookupFeatures,
    SoftmaxSampling,
    TopKCandidates,
    UnrollCandidates,
)

RESERVED_IDS = (0, 1, 2)  # Categorify's padding, null and out-of-vocabulary ids
#: features of an item or session the store lacks
ITEM_DEFAULTS = {"category": 2, "price_bucket": 0, "popularity": 0.0, "tags": []}
SESSION_DEFAULTS = {"device": 0}


@dataclass(frozen=True)
class FeatureSource:
    """Where the features come from: Feast's feature server at ``feast_url``, or the tables."""

    feast_url: str | None = None
    items: pd.DataFrame | None = None
    sessions: pd.DataFrame | None = None
    timeout_s: float = 0.5
    url_env: str | None = None

    def item_features(self):
        if self.feast_url is not None:
            return FeastFeatures(
                self.feast_url,
                view=ITEM_VIEW,
                entity="item_id",
                column="candidate_ids",
                features=ITEM_FEATURES,
                defaults=ITEM_DEFAULTS,
                timeout_s=self.timeout_s,
                url_env=self.url_env,
            )
        return LookupFeatures(
            self.items,
            key="item_id",
            column="candidate_ids",
            features=ITEM_FEATURES,
            defaults=ITEM_DEFAULTS,
            name=ITEM_VIEW,
        )

    def session_features(self):
        if self.feast_url is not None:
            return FeastFeatures(
                self.feast_url,
                view=SESSION_VIEW,
                entity="session_id",
                features=SESSION_FEATURES,
                defaults=SESSION_DEFAULTS,
                timeout_s=self.timeout_s,
                url_env=self.url_env,
            )
        return LookupFeatures(
            self.sessions,
            key="session_id",
            features=SESSION_FEATURES,
            defaults=SESSION_DEFAULTS,
            name=SESSION_VIEW,
        )


def candidates_graph(workflow, session_model, *, candidates: int = 200, index=None, blocked=()):
    """(the workflow's node, each session's filtered candidates: raw ``candidate_ids`` and their
    retrieval ``candidate_scores``, ragged)."""
    session = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    retrieved = (
        session
        >> PredictPytorch(session_model, backend="python", output="session_embedding")
        >> RetrieveTopK(
            candidates,
            session_model,
            index=index or ExactIndex(),
            seen_items=session[ITEM_LIST_COLUMN],
            exclude_ids=RESERVED_IDS,
        )
        >> DecodeItemIds(workflow, source_column="item_id", columns=["item_ids"])
    )
    return session, retrieved >> FilterCandidates(block_ids=blocked)


def ranking_rows_graph(workflow, session_model, features: FeatureSource, **candidate_options):
    """(each session's filtered candidates, one row per (session, candidate) with what the ranker
    reads): the pipeline up to the ranker, which the example also trains the ranker on."""
    session, filtered = candidates_graph(workflow, session_model, **candidate_options)
    session_level = session["session_id", CATEGORY_LIST_COLUMN] + (
        session["session_id"] >> features.session_features()
    )
    rows = filtered >> UnrollCandidates(session_level)
    return session, filtered, rows + (rows["candidate_ids"] >> features.item_features())


def recommendations_graph(
    workflow,
    session_model,
    ranker,
    features: FeatureSource,
    *,
    k: int = 10,
    candidates: int = 200,
    index=None,
    blocked=(),
    sampling: dict | None = None,
    ranker_backend: str = "pytorch",
):
    """The whole pipeline: per session ``item_ids`` (raw, ``[-1, k]``, -1 past ``item_count``),
    ``item_scores`` (the ranker's) and ``item_count``. ``sampling`` (``{"temperature": 1.0,
    "seed": 0}``) orders by a softmax sample instead of the top-k."""
    session, filtered, rows = ranking_rows_graph(
        workflow, session_model, features, candidates=candidates, index=index, blocked=blocked
    )
    scored = rows >> PredictPytorch(
        ranker, ranking.input_schema(), ranking.output_schema(), backend=ranker_backend
    )
    if sampling is not None:
        return scored >> SoftmaxSampling(
            k, filtered["candidate_ids"], session_key=session["session_id"], **sampling
        )
    return scored >> TopKCandidates(k, filtered["candidate_ids"])
