"""Warm-up requests pass the workflow's filters, or the export says which filter none passed."""

from __future__ import annotations

import json

import numpy as np
import nvtabular as nvt
import pytest
from merlin.io import Dataset

from merlin_torch_serving import Ensemble, ModelOptions, TransformWorkflow
from merlin_torch_serving.data import wire
from merlin_torch_serving.export.warmup_files import read_request_sample
from tests import toy_session


def filtered_sessions(vocabulary_dir, minimum_clicks: int) -> nvt.Workflow:
    items = ["item_id"] >> nvt.ops.Categorify(out_path=str(vocabulary_dir))
    grouped = (["session_id", "timestamp"] + items) >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={"item_id": ["list", "count"]},
        name_sep="-",
    )
    kept = grouped >> nvt.ops.Filter(f=lambda df: df["item_id-count"] >= minimum_clicks)
    workflow = nvt.Workflow(kept)
    workflow.fit(
        Dataset(toy_session.interactions()[["session_id", "timestamp", "item_id"]], cpu=True)
    )
    return workflow


def warmup_session(repository, step: str) -> np.ndarray:
    """The session ids of a step's warm-up request, as Triton reads them from the file."""
    config = (repository / step / "config.pbtxt").read_text()
    file_name = config.split('key: "session_id"')[1].split('input_data_file: "')[1].split('"')[0]
    return np.frombuffer((repository / step / "warmup" / file_name).read_bytes(), dtype=np.int64)


def test_warm_up_request_is_a_session_long_enough_for_a_count_filter(tmp_path):
    workflow = filtered_sessions(tmp_path / "vocabulary", minimum_clicks=3)
    result = Ensemble(TransformWorkflow(workflow), workflow.input_schema).export(
        tmp_path / "repo", "reco"
    )

    session = warmup_session(tmp_path / "repo", "reco-0-transformworkflow")
    assert len(session) >= 3
    assert len(set(session)) == 1
    assert result.warnings == []


def test_export_names_the_filter_no_warm_up_request_passes(tmp_path, caplog):
    workflow = filtered_sessions(tmp_path / "vocabulary", minimum_clicks=1000)
    with caplog.at_level("WARNING", logger="merlin_torch_serving"):
        result = Ensemble(TransformWorkflow(workflow), workflow.input_schema).export(
            tmp_path / "repo", "reco"
        )

    assert len(result.warnings) == 1
    assert (
        'no warm-up request passed Filter(lambda df: df["item_id-count"] >= minimum_clicks)'
        in result.warnings[0]
    )
    manifest = json.loads((tmp_path / "repo" / "reco" / "1" / "manifest.json").read_text())
    assert manifest["warmup"] == {"passes_filters": False, "problem": result.warnings[0]}
    assert any("no warm-up request passed" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("batching", [False, True])
def test_the_ensemble_keeps_the_request_its_steps_warmed_up_with_as_a_client_sends_it(
    tmp_path, batching
):
    workflow = filtered_sessions(tmp_path / "vocabulary", minimum_clicks=3)
    ensemble = Ensemble(TransformWorkflow(workflow), workflow.input_schema)
    ensemble.export(tmp_path / "repo", "reco", options=ModelOptions(batching=batching))

    arrays, count = read_request_sample(tmp_path / "repo" / "reco")
    assert count == ModelOptions().warmup_count
    assert sorted(arrays) == sorted(workflow.input_schema.column_names)
    lead = [1] if batching else []
    assert {
        name: list(array.shape[: len(lead)]) for name, array in arrays.items()
    } == dict.fromkeys(arrays, lead)
    request = {name: array.reshape(-1) for name, array in arrays.items()}
    if not batching:  # a batched python step warms up in its stub, without Triton's sample
        np.testing.assert_array_equal(
            request["session_id"], warmup_session(tmp_path / "repo", "reco-0-transformworkflow")
        )
    # a whole session of the request the steps were warmed with: it passes the filter
    answer = ensemble.run(wire.from_wire(request, ensemble.input_schema))
    assert not np.asarray(answer["filtered_out"].values).any()


def test_no_request_is_kept_when_warm_up_is_off(tmp_path):
    workflow = filtered_sessions(tmp_path / "vocabulary", minimum_clicks=3)
    Ensemble(TransformWorkflow(workflow), workflow.input_schema).export(
        tmp_path / "repo", "reco", options=ModelOptions(warmup_count=0)
    )
    assert read_request_sample(tmp_path / "repo" / "reco") is None
