"""The ranking example: synthetic impressions, a row-per-row workflow, a DLRM-style model, and its
mixed export checked the way each backend runs it (the served runs are in tests/integration)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from merlin.dag import ColumnSelector
from merlin.schema import Tags

from examples.ranking import data, features, model
from examples.ranking.demo import scoring_graph
from merlin_torch_serving import Ensemble, TransformWorkflow
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.export.python_model import HostedStep
from tests.session_models import SERVED_TORCH_THREADS, torch_threads


def eager_scores(ranking, rows: pd.DataFrame) -> np.ndarray:
    """The trained model on NVTabular's own transform of ``rows``, summing floats with the thread
    count in-process runs and served models use: the reference."""
    with torch_threads(SERVED_TORCH_THREADS):
        return model.predict(ranking.model, features.transform(ranking.workflow, rows))


def request_rows(ranking, n: int = 40) -> pd.DataFrame:
    """Held-out impressions without the label.

    They include unseen ids, an unseen device and missing values.
    """
    rows = ranking.held_out.head(n).drop(columns=[data.LABEL_COLUMN]).copy()
    rows.loc[rows.index[:3], "user_id"] = [1, 2, 3]  # never seen in training
    rows.loc[rows.index[3], "device"] = "smart-tv"
    rows.loc[rows.index[4:8], "price"] = np.nan
    return rows.reset_index(drop=True)


# --- data and workflow ------------------------------------------------------------------------


def test_impressions_are_seeded_and_miss_some_continuous_values():
    first = data.generate_impressions(2_000, seed=5)
    pd.testing.assert_frame_equal(first, data.generate_impressions(2_000, seed=5))
    assert not first.equals(data.generate_impressions(2_000, seed=6))
    for column in data.CONTINUOUS_COLUMNS:
        assert 0.02 < first[column].isna().mean() < 0.1
    assert not first[list(data.CATEGORICAL_COLUMNS)].isna().any().any()
    assert set(first[data.LABEL_COLUMN]) == {0, 1}


def test_split_rejects_a_fraction_outside_zero_and_one():
    with pytest.raises(
        ValueError, match=re.escape("held_out_fraction must be between 0 and 1, got 1.0")
    ):
        data.split(data.generate_impressions(100), held_out_fraction=1.0)


def test_workflow_keeps_one_row_per_impression_in_order_with_no_missing_values(ranking):
    rows = request_rows(ranking)
    transformed = features.transform(ranking.workflow, rows)
    assert len(transformed) == len(rows)
    assert not transformed.isna().any().any()
    schema = ranking.workflow.output_schema
    assert schema.select_by_tag(Tags.CATEGORICAL).column_names == list(data.CATEGORICAL_COLUMNS)
    assert schema.select_by_tag(Tags.CONTINUOUS).column_names == list(data.CONTINUOUS_COLUMNS)
    # unseen users share one out-of-vocabulary id; the same user keeps its id wherever it appears
    assert (
        transformed["user_id"].iloc[0]
        == transformed["user_id"].iloc[1]
        == transformed["user_id"].iloc[2]
    )
    normalized = features.transform(ranking.workflow, ranking.train)["price"]
    assert abs(normalized.mean()) < 1e-6
    assert abs(normalized.std() - 1) < 1e-3


def test_the_model_beats_the_item_click_rate_baseline_on_held_out_rows(ranking):
    labels = ranking.held_out[data.LABEL_COLUMN].to_numpy()
    click_rate = ranking.train.groupby("item_id")[data.LABEL_COLUMN].mean()
    baseline = (
        ranking.held_out["item_id"].map(click_rate).fillna(ranking.train[data.LABEL_COLUMN].mean())
    )
    assert (
        model.auc(eager_scores(ranking, ranking.held_out), labels)
        > model.auc(baseline.to_numpy(), labels) + 0.03
    )


def test_auc_counts_the_pairs_a_click_wins_and_half_the_ties():
    assert model.auc(np.array([0.9, 0.1, 0.5, 0.5]), np.array([1, 0, 1, 0])) == pytest.approx(0.875)
    with pytest.raises(ValueError, match="both clicked and not clicked"):
        model.auc(np.array([0.2]), np.array([1]))


def test_build_model_needs_categorical_and_continuous_columns(ranking):
    with pytest.raises(ValueError, match="needs categorical and continuous columns"):
        model.build_model(ranking.workflow.output_schema.remove_by_tag(Tags.CONTINUOUS))


# --- serving graph ----------------------------------------------------------------------------


def test_the_in_process_ensemble_scores_like_the_eager_model(ranking):
    ensemble = Ensemble(
        scoring_graph(ranking.workflow, ranking.model), ranking.workflow.input_schema
    )
    rows = request_rows(ranking)
    scored = ensemble.transform(rows)
    assert list(scored.columns) == [model.OUTPUT_COLUMN]
    assert len(scored) == len(rows)
    np.testing.assert_array_equal(
        scored[model.OUTPUT_COLUMN].to_numpy(), eager_scores(ranking, rows)
    )


@pytest.fixture(scope="module")
def mixed_export(ranking, tmp_path_factory):
    ensemble = Ensemble(
        scoring_graph(ranking.workflow, ranking.model, backend="pytorch"),
        ranking.workflow.input_schema,
    )
    path = tmp_path_factory.mktemp("ranking_repository")
    return ensemble, ensemble.export(path, "ctr")


def test_the_mixed_export_runs_the_workflow_on_python_and_the_model_on_libtorch(mixed_export):
    _, result = mixed_export
    assert result.fused == {
        "ctr-0-transformworkflow": ["TransformWorkflow"],
        "ctr-1-predictpytorch": ["PredictPytorch[pytorch]"],
    }
    manifest = json.loads((Path(result.path) / "ctr" / "1" / "manifest.json").read_text())
    assert [step["backend"] for step in manifest["steps"]] == ["python", "pytorch"]


def test_each_step_of_the_mixed_export_answers_as_its_backend_runs_it_like_the_eager_model(
    ranking, mixed_export
):
    ensemble, result = mixed_export
    rows = request_rows(ranking)
    request = wire.to_wire(frames.frame_to_table(rows, ranking.workflow.input_schema))
    workflow_step = HostedStep.load(
        f"{result.path}/ctr-0-transformworkflow/1"
    )  # as the python backend does
    transformed = workflow_step.run(request)
    module = torch.jit.load(f"{result.path}/ctr-1-predictpytorch/1/model.pt")  # as libtorch does
    with torch.inference_mode():
        scores = module(
            {
                name: torch.from_numpy(np.ascontiguousarray(array))
                for name, array in transformed.items()
            }
        )

    np.testing.assert_array_equal(scores.numpy(), eager_scores(ranking, rows))
    np.testing.assert_array_equal(
        scores.numpy(), ensemble.transform(rows)[model.OUTPUT_COLUMN].to_numpy()
    )
    expected_features = TransformWorkflow(ranking.workflow).transform(
        ColumnSelector(), frames.frame_to_table(rows, ranking.workflow.input_schema)
    )
    for name, array in wire.to_wire(expected_features).items():
        np.testing.assert_array_equal(transformed[name], array, err_msg=name)
