"""Exported ensembles on the real tritonserver: served answers equal in-process answers exactly,
the in-process run using the torch threads the served model runs with (see
``session_models.torch_threads``)."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from merlin_torch_serving import Ensemble, ModelOptions, TritonServer
from merlin_torch_serving.data import frames, wire
from tests import toy_session
from tests.fan_out import REQUEST_SCHEMA, fan_out_graph, transforms_counted
from tests.integration.test_metrics import scrape_when_published, value
from tests.served import raw_infer as infer
from tests.served import requests_answered_once
from tests.session_models import SERVED_TORCH_THREADS, torch_threads

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served_python_ensemble(triton_server, toy_workflow, toy_model):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python", k=4),
        toy_workflow.input_schema,
    )
    ensemble.export(triton_server.repository, "toy-python")
    triton_server.load("toy-python")
    return ensemble


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", [1, 7, 64])
def test_served_ensemble_equals_in_process_ensemble_exactly(
    triton_server, served_python_ensemble, toy_workflow, protocol, n_sessions
):
    rows = toy_session.interactions(n_sessions, seed=n_sessions, first_session=5000)
    rows = rows.sample(frac=1.0, random_state=n_sessions).reset_index(drop=True)  # shuffled rows
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])
    with torch_threads(SERVED_TORCH_THREADS):
        expected = wire.to_wire(served_python_ensemble.run(request))

    module, url = (
        (grpcclient, triton_server.grpc_url)
        if protocol == "grpc"
        else (httpclient, triton_server.http_url)
    )
    names = {
        wire.response_name(name, toy_workflow.input_schema.column_names): name for name in expected
    }
    served = infer(module, url, "toy-python", wire.to_wire(request), list(names))

    for served_name, name in names.items():
        assert served[served_name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(served[served_name], expected[name], err_msg=name)
    assert len(expected["session_id"]) == n_sessions


def test_served_model_runs_with_the_torch_threads_it_was_exported_with(
    triton_server, toy_workflow, toy_model
):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python", k=4),
        toy_workflow.input_schema,
    )
    ensemble.export(
        triton_server.repository, "toy-two-threads", options=ModelOptions(torch_threads=2)
    )
    triton_server.load("toy-two-threads")
    rows = toy_session.interactions(40, seed=12, first_session=9000)
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])
    with torch_threads(2):
        expected = wire.to_wire(ensemble.run(request))  # what two threads compute

    served = infer(
        grpcclient,
        triton_server.grpc_url,
        "toy-two-threads",
        wire.to_wire(request),
        ["item_ids", "item_scores"],
    )

    np.testing.assert_array_equal(served["item_ids"], expected["item_ids"])
    np.testing.assert_array_equal(served["item_scores"], expected["item_scores"])


def test_tritonserver_runs_the_warm_up_of_every_step_model_then_the_launcher_the_ensembles(
    toy_workflow, toy_model, tmp_path
):
    """Triton warms each step on its own; the launcher then sends the ensemble the request the
    steps' samples came from, over gRPC (warmup_count times) and HTTP (once), before start()
    returns: the path a client's first request takes, scheduler and frontends included."""
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python"),
        toy_workflow.input_schema,
    )
    result = ensemble.export(tmp_path, "warm", options=ModelOptions(warmup_count=2))
    with TritonServer(tmp_path, log_verbose=1) as server:
        log = server.logs()
        answered = requests_answered_once(server.http_url, server.admin_key, "warm", 2 + 1)
    (step,) = [model for model in result.models if model != "warm"]
    assert "Skipping batch 0 warmup sample" not in log
    assert log.count(f"model '{step}' instance {step}_0_0 is running warmup sample 'sample'") == 2
    assert answered["warm"] == 2 + 1
    assert answered[step] == 2 + 2 + 1  # Triton's statistics count its own warm-up too


def test_a_node_read_by_three_branches_runs_once_per_served_request(
    triton_server, pytorch_backend, tmp_path
):
    """Its readers are in three steps (python, libtorch, python): the ensemble passes its one
    result to all of them."""
    counter = tmp_path / "transforms"
    ensemble = Ensemble(fan_out_graph(counter), REQUEST_SCHEMA)
    result = ensemble.export(triton_server.repository, "fan-out")
    assert result.fused == {
        "fan-out-0-counttransforms_times": ["CountTransforms", "Times(3)"],
        "fan-out-1-times": ["Times(2)"],
        "fan-out-2-plus": ["Plus"],
    }
    triton_server.load("fan-out")
    request = {"x": np.array([1.0, 2.0, 3.0], dtype=np.float32)}
    for protocol, module, url in (
        ("grpc", grpcclient, triton_server.grpc_url),
        ("http", httpclient, triton_server.http_url),
    ):
        for _ in range(2):
            before = transforms_counted(counter)  # the export and Triton's warm-up ran it too
            served = infer(module, url, "fan-out", request, ["tripled", "summed"])
            assert transforms_counted(counter) == before + 1, protocol
            np.testing.assert_array_equal(served["tripled"], [3.0, 6.0, 9.0])
            np.testing.assert_array_equal(served["summed"], [3.0, 6.0, 9.0])


def test_an_ensemble_loaded_later_is_warmed_end_to_end_and_its_steps_count_only_traffic(
    triton_server, pytorch_backend, toy_workflow, toy_model
):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="pytorch", k=4),
        toy_workflow.input_schema,
    )
    result = ensemble.export(triton_server.repository, "warm-mixed")
    triton_server.load("warm-mixed")
    answered = requests_answered_once(
        triton_server.http_url, triton_server.admin_key, "warm-mixed", 3 + 1
    )
    (python_step,) = [model for model in result.models if model.endswith("-transformworkflow")]
    (libtorch_step,) = [m for m in result.models if m not in ("warm-mixed", python_step)]
    # three through the ensemble over gRPC, one over HTTP, each through both steps, after
    # Triton's own three to each step
    assert answered["warm-mixed"] == 3 + 1
    assert answered[python_step] == answered[libtorch_step] == 3 + 3 + 1

    rows = toy_session.interactions(2, seed=3, first_session=9100)
    infer(
        grpcclient,
        triton_server.grpc_url,
        "warm-mixed",
        wire.to_wire(frames.frame_to_table(rows[toy_workflow.input_schema.column_names])),
        ["item_ids"],
    )
    text = scrape_when_published(triton_server.metrics_url, python_step, requests=1)
    assert value(text, "mts_requests_total", model=python_step) == 1
