"""The answer log's example at test size, on the session example's fixtures (no training of its
own): the experiment's read-out names the current model better than the deliberately worse
candidate with an interval that excludes zero, and the impressions it writes train the
multi-stage example's ranker (its features from tables, without Feast)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from examples.answer_log import demo, simulate
from examples.multi_stage import catalog, pipeline, training
from examples.multi_stage import ranker as ranking
from examples.session_based import model
from merlin_torch_serving import Ensemble, ItemPopularity
from tests.session_models import MAX_SEQUENCE_LENGTH

REPLAYED_SESSIONS = 150


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, session_workflow, xlnet, session_split):
    train, held_out = session_split
    candidate = model.build_model(
        session_workflow.output_schema, max_sequence_length=MAX_SEQUENCE_LENGTH, d_model=32, seed=7
    ).eval()
    replayed = held_out[
        held_out["session_id"].isin(held_out["session_id"].unique()[:REPLAYED_SESSIONS])
    ]
    return demo.run_experiment(
        session_workflow,
        xlnet.served,
        candidate,
        ItemPopularity.fit(train, session_workflow),
        replayed,
        tmp_path_factory.mktemp("experiment"),
        serve=False,
    )


def test_the_read_out_names_the_trained_model_better_than_the_untrained_candidate(experiment):
    readout = experiment["readout"]
    assert experiment["better"] == "current"
    (hit,) = [c for c in readout.comparisons if c.metric == "hit_rate@10"]
    assert (hit.variant, hit.control) == ("candidate", "current")
    assert hit.difference.high < 0
    assert experiment["chart"].read_bytes()[:4] == b"\x89PNG"
    clicks = pd.read_parquet(experiment["clicks"])
    assert clicks[simulate.CLICKED_AT].is_monotonic_increasing
    assert len(clicks) == readout.group("overall").answers  # an answer after every click


def test_the_impressions_train_the_multi_stage_ranker(
    experiment, session_workflow, xlnet, multistage_tables
):
    features = pipeline.FeatureSource(
        items=multistage_tables.items, sessions=multistage_tables.sessions
    )
    _, _, rows = pipeline.ranking_rows_graph(
        session_workflow, xlnet.served, features, candidates=60
    )
    impressions = pd.read_parquet(experiment["impressions"])
    inputs, labels = training.logged_impressions(
        Ensemble(rows, session_workflow.input_schema),
        impressions,
        pd.read_parquet(experiment["clicks"]),
        clicked_at=simulate.CLICKED_AT,
    )
    assert 0 < labels.sum() < len(labels)
    assert len(labels) > 0.5 * len(impressions)  # most shown items are among the candidates
    ranker = ranking.build_ranker(
        catalog.category_count(session_workflow),
        catalog.PRICE_BUCKETS,
        catalog.TAG_IDS,
        catalog.DEVICES,
    )
    losses = ranking.train(ranker, inputs, labels, epochs=4)
    assert losses[-1] < losses[0]
    with torch.no_grad():
        scores = ranker.eval()(inputs).numpy()
    clicked, skipped = scores[labels == 1], scores[labels == 0]
    # the trained ranker puts a clicked impression above a skipped one more often than not
    assert np.mean(clicked[:, None] > skipped[None, :]) > 0.6
