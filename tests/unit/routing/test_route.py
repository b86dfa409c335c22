"""Route in-process: each session answered by its branch, in request order, with the branch named;
rules before the experiment, failures isolated, schemas checked as the graph is built."""

import numpy as np
import pandas as pd
import pytest
from merlin.table import TensorTable

from merlin_torch_serving import (
    DecodeItemIds,
    Ensemble,
    Experiment,
    FilteredOut,
    MostPopular,
    Predicate,
    PredictPytorch,
    Route,
    SchemaError,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.ops.unfiltered import without_filters
from tests import routed_graphs, toy_session
from tests.served import assert_frames_equal

UNSEEN_ITEM = 9_999  # never clicked in training


@pytest.fixture(scope="module")
def model(filtered_toy_workflow):
    return toy_session.scripted_model(filtered_toy_workflow)


@pytest.fixture(scope="module")
def request_rows() -> pd.DataFrame:
    """40 sessions, shuffled: one-click sessions (filtered out) and one of unknown items only."""
    rows = toy_session.interactions(40, seed=11, first_session=77_000)
    unknown = rows["session_id"] == rows["session_id"].iloc[-1]
    rows.loc[unknown, "item_id"] = UNSEEN_ITEM
    return rows.sample(frac=1.0, random_state=3).reset_index(drop=True)


def features_of(workflow):
    return workflow.input_schema.column_names >> TransformWorkflow(workflow)


def test_each_session_is_answered_by_its_branch_in_request_order_as_without_the_route(
    filtered_toy_workflow, model, request_rows
):
    workflow = filtered_toy_workflow
    routed = Ensemble(routed_graphs.routed(workflow, model), workflow.input_schema)
    answer = routed.transform(request_rows)
    features = features_of(workflow)
    ranked = Ensemble(routed_graphs.ranked(features, workflow, model), workflow.input_schema)
    popular = Ensemble(
        features
        >> MostPopular(routed_graphs.popularity(workflow), routed_graphs.K)
        >> DecodeItemIds(workflow),
        workflow.input_schema,
    )
    # a session the workflow drops reaches the fallback with its own clicks
    unfiltered = Ensemble(
        workflow.input_schema.column_names
        >> TransformWorkflow(without_filters(workflow))
        >> MostPopular(routed_graphs.popularity(workflow), routed_graphs.K)
        >> DecodeItemIds(workflow),
        workflow.input_schema,
    )
    assert answer["session_id"].tolist() == list(pd.unique(request_rows["session_id"]))
    assert list(answer.columns) == [
        "session_id",
        "filtered_out",
        "item_ids",
        "item_scores",
        "branch",
        "variant",
        "branch_error",
    ]
    experiment = Experiment(routed_graphs.EXPERIMENT, {"current": 0.5, "candidate": 0.5})
    variants = np.array(experiment.variants)[experiment.assign(answer["session_id"].to_numpy())]
    assert answer["variant"].tolist() == variants.tolist()
    counts = request_rows.groupby("session_id").size()
    assert (counts < 2).any()
    assert not (counts < 2).all()
    unknown = request_rows.groupby("session_id")["item_id"].agg(lambda s: (s == UNSEEN_ITEM).all())
    for _, row in answer.iterrows():
        session = request_rows[request_rows["session_id"] == row["session_id"]]
        filtered = counts[row["session_id"]] < 2
        to_popular = filtered or unknown[row["session_id"]]
        assert row["branch"] == ("popular" if to_popular else row["variant"])
        assert row["filtered_out"] == filtered
        graph = unfiltered if filtered else popular if to_popular else ranked
        expected = graph.transform(session).drop(columns=["filtered_out"])
        got = answer[answer["session_id"] == row["session_id"]][list(expected.columns)]
        assert_frames_equal(got.reset_index(drop=True), expected)
    assert {"popular", "current", "candidate"} == set(answer["branch"])
    assert (answer["branch_error"] == "").all()
    assert (np.stack(answer["item_ids"]) >= 500).all()  # every session got raw item ids


def test_the_first_rule_a_session_meets_decides_and_filtered_sessions_no_rule_sends_are_blank(
    filtered_toy_workflow, model, request_rows
):
    workflow = filtered_toy_workflow
    features = features_of(workflow)
    branches = {
        "long": routed_graphs.ranked(features, workflow, model),
        "short": routed_graphs.ranked(features, workflow, model),
    }
    route = Route(
        branches, rules=[(Predicate(three_or_more, ["item_id-list"]), "long")], default="short"
    )
    answer = Ensemble(features >> route, workflow.input_schema).transform(request_rows)
    lengths = request_rows.groupby("session_id").size()[answer["session_id"]].to_numpy()
    filtered = lengths < 2
    assert (
        answer["branch"].tolist()
        == np.where(filtered, "", np.where(lengths >= 3, "long", "short")).tolist()
    )
    assert (np.stack(answer["item_ids"][filtered]) == -1).all()
    assert np.isnan(np.stack(answer["item_scores"][filtered])).all()
    assert "variant" not in answer.columns


def three_or_more(arrays):
    return np.diff(arrays["item_id-list__offsets"]) >= 3


class Failing(TopK):
    """TopK that fails on every request, as a branch whose model broke."""

    def transform(self, col_selector, transformable):
        raise RuntimeError("the model is broken")


class OneRowOnly(TopK):
    """TopK that answers the first row only, as a branch that loses sessions."""

    def transform(self, col_selector, transformable):
        answer = super().transform(col_selector, transformable)
        return TensorTable({name: answer[name].values[:1] for name in answer.columns}, _unsafe=True)


def failing_route(workflow, model, fallback, failing=Failing):
    features = features_of(workflow)
    scripted, input_schema, output_schema = model
    broken = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema)
        >> failing(routed_graphs.K, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
        >> DecodeItemIds(workflow)
    )
    return features >> Route(
        {"broken": broken, "fine": routed_graphs.ranked(features, workflow, model)},
        rules=[(FilteredOut(), "fine")],
        default=Experiment("half", {"broken": 1, "fine": 1}),
        fallback=fallback,
    )


def test_a_failing_branch_leaves_the_other_sessions_answered_and_names_its_error(
    filtered_toy_workflow, model, request_rows
):
    workflow = filtered_toy_workflow
    answer = Ensemble(failing_route(workflow, model, None), workflow.input_schema).transform(
        request_rows
    )
    broken = (answer["variant"] == "broken") & ~answer["filtered_out"]
    assert broken.any()
    assert (~broken).any()
    assert (
        answer["branch_error"][broken]
        .str.fullmatch(r"branch 'broken' failed: .*RuntimeError: the model is broken")
        .all()
    )
    assert (answer["branch"][broken] == "").all()
    assert (np.stack(answer["item_ids"][broken]) == -1).all()
    assert (answer["branch"][~broken] == "fine").all()
    assert (np.stack(answer["item_ids"][~broken]) >= 500).all()
    assert (answer["branch_error"][~broken] == "").all()


def test_the_fallback_answers_the_sessions_of_a_failed_branch(
    filtered_toy_workflow, model, request_rows
):
    workflow = filtered_toy_workflow
    answer = Ensemble(failing_route(workflow, model, "fine"), workflow.input_schema).transform(
        request_rows
    )
    assert (answer["branch"] == "fine").all()
    assert (np.stack(answer["item_ids"]) >= 500).all()
    broken = (answer["variant"] == "broken") & ~answer["filtered_out"]
    assert answer["branch_error"][broken].str.startswith("branch 'broken' failed").all()
    assert (answer["branch_error"][~broken] == "").all()


def test_a_branch_that_answers_fewer_rows_than_sessions_fails_and_the_fallback_answers(
    filtered_toy_workflow, model, request_rows
):
    workflow = filtered_toy_workflow
    route = failing_route(workflow, model, "fine", failing=OneRowOnly)
    answer = Ensemble(route, workflow.input_schema).transform(request_rows)
    broken = (answer["variant"] == "broken") & ~answer["filtered_out"]
    assert (answer["branch"] == "fine").all()
    assert (
        answer["branch_error"][broken]
        .str.fullmatch(r"branch 'broken' failed: ValueError: it answered 1 rows for \d+ sessions")
        .all()
    )


def test_set_weights_moves_sessions_for_the_next_requests(
    filtered_toy_workflow, model, request_rows
):
    workflow = filtered_toy_workflow
    graph = routed_graphs.routed(workflow, model)
    ensemble = Ensemble(graph, workflow.input_schema)
    graph.op.set_weights({"current": 0, "candidate": 1})
    answer = ensemble.transform(request_rows)
    assert set(answer["variant"]) == {"candidate"}
    with pytest.raises(ValueError, match=r"missing: \['candidate'\]"):
        graph.op.set_weights({"current": 1})
    with pytest.raises(ValueError, match=r"has no experiment to weigh"):
        Route({"a": graph}, default="a").set_weights({"a": 1})


def test_branches_must_return_the_same_columns_in_the_same_form(filtered_toy_workflow, model):
    workflow = filtered_toy_workflow
    features = features_of(workflow)
    decoded = routed_graphs.ranked(features, workflow, model)
    encoded = features >> MostPopular(routed_graphs.popularity(workflow), routed_graphs.K)
    with pytest.raises(SchemaError, match=r"end branch 'popular' with DecodeItemIds too"):
        Ensemble(
            features >> Route({"model": decoded, "popular": encoded}, default="model"),
            workflow.input_schema,
        )
    fewer = routed_graphs.ranked(features, workflow, model)["item_ids"]
    with pytest.raises(SchemaError, match=r"branch 'ids' to return the columns of branch 'model'"):
        Ensemble(
            features >> Route({"model": decoded, "ids": fewer}, default="model"),
            workflow.input_schema,
        )


def test_a_route_names_the_branch_a_rule_or_experiment_needs_and_does_not_have():
    with pytest.raises(ValueError, match=r"the default must be one of the route's branches"):
        Route({"a": "x"}, default="b")
    with pytest.raises(ValueError, match=r"variant of experiment 'e' must be one of"):
        Route({"a": "x"}, default=Experiment("e", {"a": 1, "c": 1}))
    with pytest.raises(ValueError, match=r"target of rule FilteredOut\(\) must be one of"):
        Route({"a": "x"}, rules=[(FilteredOut(), "c")], default="a")
    with pytest.raises(TypeError, match=r"a rule is a \(condition, branch\) pair"):
        Route({"a": "x"}, rules=[FilteredOut()], default="a")


def test_a_branch_that_reads_past_the_route_is_a_schema_error(filtered_toy_workflow, model):
    workflow = filtered_toy_workflow
    features = features_of(workflow)
    narrow = features["session_id", "category-list"]
    branch = routed_graphs.ranked(features, workflow, model)
    with pytest.raises(SchemaError, match=r"'item_id-list'.*build the sub-graph on the node"):
        Ensemble(narrow >> Route({"a": branch}, default="a"), workflow.input_schema)
