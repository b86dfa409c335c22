"""An official example made ready for the tests: fitted workflow, trained model, serving graph, and
raw requests shaped like the sessions users send (shuffled rows, one-click, over-long, unseen
items).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np
import pandas as pd
from merlin.io import Dataset

from merlin_torch_serving import DecodeItemIds, Ensemble, PredictPytorch, TopK, TransformWorkflow
from tests.official import training
from tests.session_models import RESERVED_IDS

TOP_K = 5
UNSEEN_ITEM_ID = 40_000_000  # never in training (the generators clip item ids at 50,000)
OVER_LONG = 27  # clicks: more than the examples' 20


@dataclass(frozen=True)
class Example:
    name: str
    module: ModuleType
    workflow: object
    processed: pd.DataFrame
    model: object
    held_out: pd.DataFrame  # raw rows of sessions never trained on

    @property
    def scores_column(self) -> str:
        """The name of the scores column.

        Transformers4Rec names the scores of its own top k ``item_id_scores``; TopK ``item_scores``.
        """
        return "item_id_scores" if self.has_top_k else "item_scores"

    @property
    def has_top_k(self) -> bool:
        """The end-to-end example ranks inside the model (``model.top_k``), as its notebook does."""
        return self.name == "end_to_end"

    def graph(self, backend: str = "python", workflow_backend: str = "python", compiled=None):
        """The serving graph users build from the notebook: workflow >> model, then for the
        getting-started model (which scores the whole catalog) TopK and the raw ids.
        ``backend`` is the model's, ``workflow_backend`` the workflow's, ``compiled`` what their
        libtorch step is."""
        features = self.workflow.input_schema.column_names >> TransformWorkflow(
            self.workflow, backend=workflow_backend, compiled=compiled
        )
        scores = features >> PredictPytorch(self.model, backend=backend, compiled=compiled)
        if self.has_top_k:
            return scores
        return (
            scores
            >> TopK(TOP_K, seen_items=features["item_id-list"], exclude_ids=RESERVED_IDS)
            >> DecodeItemIds(self.workflow, source_column="item_id")
        )

    def ensemble(
        self, backend: str = "python", workflow_backend: str = "python", compiled=None
    ) -> Ensemble:
        return Ensemble(self.graph(backend, workflow_backend, compiled), self.workflow.input_schema)


def prepare(module: ModuleType, categories_path: str) -> Example:
    train = module.interactions(seed=0)
    workflow = module.workflow(categories_path)
    processed = (
        workflow.fit_transform(Dataset(train, cpu=True)).to_ddf().compute().reset_index(drop=True)
    )
    model = module.model(workflow.output_schema)
    training.train(model, processed, module.MODEL_COLUMNS, module.SESSIONS_MAX_LENGTH)
    if module.__name__.endswith("end_to_end"):
        model.top_k = TOP_K
    held_out = module.interactions(seed=1)  # other clicks; requests renumber their sessions
    return Example(module.__name__.rsplit(".", 1)[-1], module, workflow, processed, model, held_out)


def request_rows(example: Example, n_sessions: int, seed: int) -> pd.DataFrame:
    """Raw rows of ``n_sessions`` sessions, shuffled: always a one-click session (the Filter drops
    it) and, from two sessions on, an over-long one; about one click in five is an item never
    seen in training. Session ids are renumbered so that they never collide."""
    rng = np.random.default_rng(seed)
    rows = example.held_out
    lengths = rows.groupby("session_id").size()
    single = lengths[lengths == 1].index[0]
    chosen = [single] + list(rng.choice(lengths[lengths >= 2].index, n_sessions - 1, replace=False))
    sessions = [rows[rows["session_id"] == session] for session in chosen]
    if n_sessions >= 2:
        sessions[1] = _lengthened(sessions[1], rows["item_id"].to_numpy(), rng)
    request = pd.concat(
        [
            session.assign(session_id=900_000 + seed * 1000 + number)
            for number, session in enumerate(sessions)
        ]
    )
    unseen = rng.random(len(request)) < 0.2
    request.loc[unseen, "item_id"] = UNSEEN_ITEM_ID + np.arange(unseen.sum())
    if "itemid_ts_first" in request.columns:  # an item first seen now
        request.loc[unseen, "itemid_ts_first"] = request.loc[unseen, "timestamp"]
    request = request.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    return request


def one_session_requests(example: Example, count: int = 32) -> list[pd.DataFrame]:
    """The raw rows of the first ``count`` held-out sessions of 3 to 12 clicks, one per request:
    what a real-time caller sends, session by session."""
    rows = example.held_out
    lengths = rows.groupby("session_id").size()
    chosen = lengths[lengths.between(3, 12)].index[:count]
    return [rows[rows["session_id"] == session] for session in chosen]


def _lengthened(session: pd.DataFrame, items: np.ndarray, rng) -> pd.DataFrame:
    """The session stretched to OVER_LONG clicks of other known items, seconds apart in time."""
    longer = session.iloc[np.resize(np.arange(len(session)), OVER_LONG)].copy()
    if "timestamp" in longer.columns:
        longer["timestamp"] = longer["timestamp"].min() + np.arange(OVER_LONG) * 7
    longer["item_id"] = rng.choice(items, OVER_LONG)
    return longer.reset_index(drop=True)
