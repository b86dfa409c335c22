"""Exported ensembles on the real tritonserver: served answers equal in-process answers exactly."""

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from merlin_torch_serving import BackendNotAvailableError, Ensemble, ModelOptions, TritonServer, frames, wire
from tests import toy_session
from tests.served import raw_infer as infer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served_python_ensemble(triton_server, toy_workflow, toy_model):
    ensemble = Ensemble(toy_session.session_graph(toy_workflow, toy_model, backend="python", k=4), toy_workflow.input_schema)
    ensemble.export(triton_server.repository, "toy-python")
    triton_server.load("toy-python")
    return ensemble


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", [1, 7, 64])
def test_served_ensemble_equals_in_process_ensemble_exactly(triton_server, served_python_ensemble, toy_workflow, protocol, n_sessions):
    rows = toy_session.interactions(n_sessions, seed=n_sessions, first_session=5000)
    rows = rows.sample(frac=1.0, random_state=n_sessions).reset_index(drop=True)  # shuffled rows
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])
    expected = wire.to_wire(served_python_ensemble.run(request))

    module, url = (grpcclient, triton_server.grpc_url) if protocol == "grpc" else (httpclient, triton_server.http_url)
    names = {wire.response_name(name, toy_workflow.input_schema.column_names): name for name in expected}
    served = infer(module, url, "toy-python", wire.to_wire(request), list(names))

    for served_name, name in names.items():
        assert served[served_name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(served[served_name], expected[name], err_msg=name)
    assert len(expected["session_id"]) == n_sessions


def test_libtorch_export_passes_its_check_and_the_bundled_server_says_it_cannot_load_it(triton_server, toy_workflow, toy_model):
    ensemble = Ensemble(toy_session.session_graph(toy_workflow, toy_model, backend="pytorch"), toy_workflow.input_schema)
    result = ensemble.export(triton_server.repository, "toy-libtorch")  # runs the libtorch check
    assert "toy-libtorch-1-predictpytorch_topk" in result.models

    with pytest.raises(BackendNotAvailableError) as error:
        triton_server.load("toy-libtorch")

    message = str(error.value)
    assert "'toy-libtorch-1-predictpytorch_topk' needs backend 'pytorch'" in message
    assert "it has: python, ensemble" in message or "it has: ensemble, python" in message
    assert "backend='python'" in message
    assert error.value.missing == {"toy-libtorch-1-predictpytorch_topk": "pytorch"}


def test_served_model_runs_with_the_torch_threads_it_was_exported_with(triton_server, toy_workflow, toy_model):
    ensemble = Ensemble(toy_session.session_graph(toy_workflow, toy_model, backend="python", k=4), toy_workflow.input_schema)
    ensemble.export(triton_server.repository, "toy-one-thread", options=ModelOptions(torch_threads=1))
    triton_server.load("toy-one-thread")
    rows = toy_session.interactions(40, seed=12, first_session=9000)
    request = frames.frame_to_table(rows[toy_workflow.input_schema.column_names])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = wire.to_wire(ensemble.run(request))  # what one thread computes
    finally:
        torch.set_num_threads(threads)

    served = infer(grpcclient, triton_server.grpc_url, "toy-one-thread", wire.to_wire(request), ["item_ids", "item_scores"])

    np.testing.assert_array_equal(served["item_ids"], expected["item_ids"])
    np.testing.assert_array_equal(served["item_scores"], expected["item_scores"])


def test_tritonserver_runs_the_warm_up_of_every_step_model(toy_workflow, toy_model, tmp_path):
    ensemble = Ensemble(toy_session.session_graph(toy_workflow, toy_model, backend="python"), toy_workflow.input_schema)
    result = ensemble.export(tmp_path, "warm", options=ModelOptions(warmup_count=2))
    with TritonServer(tmp_path, log_verbose=1) as server:
        log = server.logs()
    (step,) = [model for model in result.models if model != "warm"]
    assert "Skipping batch 0 warmup sample" not in log
    assert log.count(f"model '{step}' instance {step}_0_0 is running warmup sample 'sample'") == 2
