"""Property tests: the session workflows' TorchScript form, saved and loaded back as libtorch loads
it, equals NVTabular's transform on random requests, tied timestamps included (the oracle keeps
tied clicks in request order, as the library does; a test below checks that order by hand)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merlin_torch_serving import Ensemble, TransformWorkflow
from merlin_torch_serving.data import wire
from merlin_torch_serving.scripted_workflow import ScriptedWorkflow
from tests.fastpath.helpers import assert_wire_equal, known_ids, oracle, reloaded, run_module
from tests.fastpath.strategies import session_requests

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def scripted_session(session_workflow):
    scripted = ScriptedWorkflow(session_workflow, ["session_id"])
    return reloaded(scripted.scripted())


@pytest.fixture(scope="module")
def scripted_padded(padded_session_workflow):
    return reloaded(ScriptedWorkflow(padded_session_workflow).scripted())


def test_session_workflows_have_a_torchscript_form_for_every_node(
    session_workflow, padded_session_workflow
):
    for workflow in (session_workflow, padded_session_workflow):
        scripted = ScriptedWorkflow(workflow)
        assert scripted.uncompiled == []
        assert scripted.complete


@PROPERTY
@given(data=st.data())
def test_scripted_session_workflow_equals_nvtabular_on_random_requests(
    session_workflow, scripted_session, data
):
    request = data.draw(session_requests(known_ids(session_workflow, "item_id")))
    assert_wire_equal(run_module(scripted_session, request), oracle(session_workflow, request))


@PROPERTY
@given(data=st.data())
def test_scripted_padded_session_workflow_equals_nvtabular_on_random_requests(
    padded_session_workflow, scripted_padded, data
):
    request = data.draw(session_requests(known_ids(padded_session_workflow, "item_id")))
    got = run_module(scripted_padded, request)
    assert got["item_id-list"].shape[1] == 20
    assert_wire_equal(got, oracle(padded_session_workflow, request))


def test_scripted_and_compiled_session_workflows_keep_tied_clicks_in_request_order(
    session_workflow, scripted_session, compiled_session
):
    vocabulary = known_ids(session_workflow, "item_id")
    request = {
        "session_id": np.array([9, 9, 9, 9, 9, 4]),
        "timestamp": np.array([20, 10, 20, 10, 20, 5]),
        "item_id": np.array(vocabulary[:5] + [vocabulary[0]]),
        "category": np.array([1, 2, 3, 4, 5, 6]),
    }
    got = run_module(scripted_session, request)
    # in timestamp order 0..5, NVTabular lists session 4 (row 5), then session 9 (rows 0 to 4)
    in_row_order = oracle(session_workflow, {**request, "timestamp": np.arange(6)})
    label = np.concatenate([in_row_order["item_id-list__values"][1:], [0]])
    label[5] = in_row_order["item_id-list__values"][0]
    np.testing.assert_array_equal(got["session_id"], [4, 9])
    # session 9: the clicks at 10 (rows 1 and 3), then those at 20 (rows 0, 2 and 4)
    np.testing.assert_array_equal(got["item_id-list__values"], label[[5, 1, 3, 0, 2, 4]])
    np.testing.assert_array_equal(got["timestamp-first"], [5, 10])
    assert_wire_equal(compiled_session.transform(request), got)


def test_scripted_session_workflow_answers_an_empty_request_with_empty_outputs(scripted_session):
    request = {
        name: np.array([], dtype=np.int64)
        for name in ["session_id", "timestamp", "item_id", "category"]
    }
    got = run_module(scripted_session, request)
    np.testing.assert_array_equal(got["item_id-list__offsets"], [0])
    assert got["item_id-list__values"].dtype == np.int64
    assert got["item_id-count"].dtype == np.int32
    assert got["item_id-count"].shape == (0,)


@pytest.fixture(scope="module")
def split_rich(rich_session_workflow):
    """The rich workflow's TorchScript form: string ids and LogOp run first, in python."""
    workflow = TransformWorkflow(rich_session_workflow, backend="pytorch", keep_request_order=False)
    return Ensemble(
        rich_session_workflow.input_schema.column_names >> workflow,
        rich_session_workflow.input_schema,
    )


def test_rich_workflow_runs_its_string_categorify_and_log_in_python_before_torchscript(split_rich):
    assert [call.op.label for call in split_rich.plan.calls] == [
        "TransformWorkflow[python: Categorify, LogOp]",
        "TransformWorkflow",
    ]
    assert [call.op.backend for call in split_rich.plan.calls] == ["python", "pytorch"]


@PROPERTY
@given(data=st.data())
def test_rich_workflow_split_in_two_equals_nvtabular_on_random_requests(
    rich_session_workflow, split_rich, data
):
    request = data.draw(
        session_requests(
            known_ids(rich_session_workflow, "item_id"),
            item_kind="str",
            min_longest=2,
            with_price=True,
        )
    )
    answer = split_rich.run(wire.from_wire(request, rich_session_workflow.input_schema))
    assert_wire_equal(wire.to_wire(answer), oracle(rich_session_workflow, request))
