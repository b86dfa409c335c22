"""An operator's sub-graphs in the export: each branch of a route an ensemble of its own beside the
ensemble (or a python step inside the route's, inline), recorded in the manifest and replaced with
it."""

import json

import pytest

from merlin_torch_serving import Ensemble, ExportError, Route, TransformWorkflow
from merlin_torch_serving.export.manifest import verify_export
from merlin_torch_serving.ops.sub_models import read_sub_models
from tests import routed_graphs, toy_session


@pytest.fixture(scope="module")
def model(filtered_toy_workflow):
    return toy_session.scripted_model(filtered_toy_workflow)


def routed(workflow, model, **settings):
    return Ensemble(routed_graphs.routed(workflow, model, **settings), workflow.input_schema)


def test_branches_are_ensembles_of_their_own_and_inline_ones_live_in_the_routes_step(
    filtered_toy_workflow, model, tmp_path
):
    result = routed(filtered_toy_workflow, model).export(tmp_path, "recs")
    assert result.models == [
        "recs-0-transformworkflow_route",
        "recs.current-0-predictpytorch_topk_decodeitemids",
        "recs.current",
        "recs.candidate-0-predictpytorch_topk_decodeitemids",
        "recs.candidate",
        "recs",
    ]
    artifacts = tmp_path / "recs-0-transformworkflow_route" / "1" / "ops" / "1"
    served = read_sub_models(artifacts)
    assert {name: sub.model for name, sub in served.items()} == {
        "current": "recs.current",
        "candidate": "recs.candidate",
        "popular": "recs.popular",
    }
    assert served["popular"].inline == str(artifacts / "sub_graphs" / "popular")
    assert (artifacts / "sub_graphs" / "popular" / "step.json").is_file()
    manifest = json.loads((tmp_path / "recs" / "1" / "manifest.json").read_text())
    assert set(manifest["sub_ensembles"]) == {"recs.current", "recs.candidate"}
    verify_export(tmp_path, "recs")


def test_an_export_over_a_routed_one_removes_the_branches_it_no_longer_has(
    filtered_toy_workflow, model, tmp_path
):
    routed(filtered_toy_workflow, model, inline=()).export(tmp_path, "recs")
    assert (tmp_path / "recs.popular").is_dir()
    routed(filtered_toy_workflow, model).export(tmp_path, "recs", overwrite=True)
    assert not (tmp_path / "recs.popular").exists()
    assert not list(tmp_path.glob("recs.popular-*"))


def test_a_branch_that_needs_a_libtorch_step_cannot_be_inline(
    filtered_toy_workflow, model, tmp_path
):
    ensemble = routed(
        filtered_toy_workflow, model, candidate_backend="pytorch", inline=("candidate",)
    )
    with pytest.raises(
        ExportError, match=r"hosts its sub-graph 'candidate' in its own python step"
    ):
        ensemble.export(tmp_path, "recs")
    assert not (tmp_path / "recs").exists()


def test_a_branch_whose_name_makes_no_model_name_is_refused(filtered_toy_workflow, model, tmp_path):
    workflow = filtered_toy_workflow
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    route = Route(
        {"new model": routed_graphs.ranked(features, workflow, model)}, default="new model"
    )
    with pytest.raises(ExportError, match=r"'recs.new model', which is not a valid Triton model"):
        Ensemble(features >> route, workflow.input_schema).export(tmp_path, "recs")
