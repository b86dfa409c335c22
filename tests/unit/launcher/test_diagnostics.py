"""What the launcher reads out of tritonserver's log and answers, tested on recorded excerpts.

Each file under logs/ was written by tritonserver 2.51 (the one nvidia-pytriton bundles) on a CPU
machine, in the situation its name says; paths were shortened to /srv/models.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_torch_serving.client import transport
from merlin_torch_serving.client.health import stub_answered
from merlin_torch_serving.exceptions import (
    BackendNotAvailableError,
    InferenceError,
    ModelLoadError,
    PortInUseError,
    ServerExitedError,
)
from merlin_torch_serving.launcher import diagnostics

LOGS = Path(__file__).parent / "logs"


def recorded(name: str) -> str:
    return (LOGS / name).read_text()


# -- a taken port ---------------------------------------------------------------------------------


TAKEN_PORTS = [("http", 53749, "HTTP"), ("grpc", 41513, "gRPC"), ("metrics", 38635, "metrics")]


@pytest.mark.parametrize(("recording", "port", "protocol"), TAKEN_PORTS)
def test_a_taken_port_is_read_from_the_log_with_its_protocol(recording, port, protocol):
    assert diagnostics.port_in_use(recorded(f"port_in_use_{recording}.log")) == (port, protocol)


def test_a_log_without_a_taken_port_names_none():
    assert diagnostics.port_in_use(recorded("start_with_failing_models.log")) is None


@pytest.mark.parametrize(("recording", "port", "protocol"), TAKEN_PORTS)
def test_a_server_that_exited_over_a_taken_port_is_a_port_in_use_error(recording, port, protocol):
    error = diagnostics.exit_error(1, recorded(f"port_in_use_{recording}.log"))
    assert isinstance(error, PortInUseError)
    assert (error.port, error.protocol) == (port, protocol)
    assert str(error).startswith(f"pass another {protocol} port, or 0")
    assert f"the {protocol} port {port} is already in use" in str(error)
    assert f"service: Unavailable - Socket '0.0.0.0:{port}' already in use" in error.log_tail


def test_the_log_tail_leaves_out_what_every_start_on_a_cpu_machine_prints():
    tail = diagnostics.log_tail(recorded("port_in_use_grpc.log"))
    for noise in (
        "NVML",
        "DCGM",
        "CudaDriverHelper",
        "CUDA driver version is insufficient",
        "CUDA memory pool",
    ):
        assert noise not in tail
    assert tail.splitlines()[-1].endswith('already in use "')
    assert (
        len(diagnostics.log_tail(recorded("start_with_failing_models.log"), lines=3).splitlines())
        == 3
    )


# -- a rejected argument ---------------------------------------------------------------------------


def test_a_rejected_argument_keeps_its_line_and_drops_the_usage_text():
    error = diagnostics.exit_error(1, recorded("rejected_argument.log"))
    assert type(error) is ServerExitedError
    assert error.returncode == 1
    assert error.log_tail.splitlines() == [
        (
            "/home/user/.venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver: "
            "unrecognized option '--no-such-option'"
        ),
        "(usage text left out; run `tritonserver --help`)",
    ]


# -- models failing at start -----------------------------------------------------------------------


def test_each_failing_model_is_explained_by_its_own_error_lines():
    log = recorded("start_with_failing_models.log")
    assert (
        diagnostics.model_errors(log, "invalid_config")
        == "Error parsing text-format inference.ModelConfig: 2:14: Message type"
        ' "inference.ModelConfig" has no field named "no_such_field".; Poll failed for model'
        " directory 'invalid_config': failed to read text proto from"
        " /srv/models/invalid_config/config.pbtxt"
    )
    assert "unable to find backend library for backend 'onnxruntime'" in diagnostics.model_errors(
        log, "needs_onnx"
    )
    assert diagnostics.model_errors(log, "fails_in_initialize").startswith(
        "failed to load 'fails_in_initialize' version 1: Internal: RuntimeError: checkpoint missing"
    )
    assert (
        diagnostics.model_errors(log, "good")
        == "not loaded; tritonserver logged no reason (see the log below)"
    )


def test_models_that_need_a_backend_the_server_lacks_make_a_backend_not_available_error():
    log = recorded("start_with_failing_models.log")
    failures = {
        name: diagnostics.model_errors(log, name) for name in ("needs_onnx", "fails_in_initialize")
    }
    assert diagnostics.missing_backends(failures) == {"needs_onnx": "onnxruntime"}

    error = diagnostics.load_error(failures, ["ensemble", "python"], log)
    assert isinstance(error, BackendNotAvailableError)
    assert (error.missing, error.available, list(error.failures)) == (
        {"needs_onnx": "onnxruntime"},
        ["ensemble", "python"],
        ["needs_onnx", "fails_in_initialize"],
    )
    assert (
        "model 'needs_onnx' needs backend 'onnxruntime', which this tritonserver does not have (it"
        " has: ensemble, python)" in str(error)
    )


def test_models_that_fail_for_other_reasons_make_a_model_load_error():
    log = recorded("start_with_failing_models.log")
    error = diagnostics.load_error(
        {"invalid_config": diagnostics.model_errors(log, "invalid_config")}, ["python"], log
    )
    assert type(error) is ModelLoadError
    assert str(error).startswith(
        "1 model(s) failed to load:\n  'invalid_config': Error parsing text-format"
    )


# -- explicit loads --------------------------------------------------------------------------------


def test_a_load_refused_as_failed_to_poll_is_explained_by_the_log_written_since():
    log = recorded("explicit_loads.log")
    answer = recorded("load_answer_invalid_config.txt")
    assert answer == "failed to load 'invalid_config', failed to poll from model repository"
    assert (
        diagnostics.load_refusal(answer, log, "invalid_config")
        == f"{answer}: Error parsing text-format inference.ModelConfig: 2:14: Message type"
        ' "inference.ModelConfig" has no field named "no_such_field".; Poll failed for model'
        " directory 'invalid_config': failed to read text proto from"
        " /srv/models/invalid_config/config.pbtxt"
    )
    missing = diagnostics.load_refusal(recorded("load_answer_not_written.txt"), log, "not_written")
    assert missing.endswith(
        "failed to poll model 'not_written': model not found in any model repository."
    )


def test_a_load_refused_for_another_reason_keeps_the_servers_answer():
    answer = recorded("load_answer_reco.txt")
    assert diagnostics.load_refusal(answer, recorded("explicit_loads.log"), "reco") == answer


def test_an_ensemble_over_a_step_without_its_backend_names_the_step_as_the_one_missing_it():
    failures = diagnostics.with_dependency_failures({"reco": recorded("load_answer_reco.txt")})
    assert list(failures) == ["reco", "needs_onnx"]
    assert failures["needs_onnx"].startswith(
        "version 1 is at UNAVAILABLE state: Invalid argument: unable to find"
    )
    error = diagnostics.load_error(
        {"reco": recorded("load_answer_reco.txt")}, ["ensemble", "python"], ""
    )
    assert isinstance(error, BackendNotAvailableError)
    assert error.missing == {"needs_onnx": "onnxruntime"}


def test_an_ensemble_whose_step_failed_names_the_step_with_its_whole_traceback():
    answer = recorded("load_answer_reco_over_broken_step.txt")
    failures = diagnostics.with_dependency_failures({"reco_over_broken_step": answer})
    assert list(failures) == ["reco_over_broken_step", "broken_step"]
    assert (
        failures["broken_step"]
        == "version 1 is at UNAVAILABLE state: Internal: ValueError: no weights here\n\n"
        "At:\n  /srv/models/broken_step/1/model.py(16): initialize"
    )
    error = diagnostics.load_error(
        {"reco_over_broken_step": answer}, ["ensemble", "python"], recorded("explicit_loads.log")
    )
    assert type(error) is ModelLoadError
    assert "2 model(s) failed to load" in str(error)
    assert (
        "failed to load 'broken_step' version 1: Internal: ValueError: no weights here"
        in error.log_tail
    )


def test_two_failed_steps_of_an_ensemble_are_told_apart():
    answer = (
        "load failed for model 'reco': ensemble 'reco' depends on 'a' which has no loaded version."
        " Model 'a' loading failed with error: version 1 is at UNAVAILABLE state: boom;  Model 'b'"
        " loading failed with error: bust;"
    )
    assert diagnostics.with_dependency_failures({"reco": answer}) == {
        "reco": answer,
        "a": "version 1 is at UNAVAILABLE state: boom",
        "b": "bust",
    }


# -- a start that times out ------------------------------------------------------------------------


def test_a_start_that_timed_out_names_the_model_still_loading():
    log = recorded("still_loading.log")
    assert diagnostics.still_loading(log) == ["slow"]
    assert (
        diagnostics.start_awaits(log, [8001], "127.0.0.1:8000")
        == "model(s) 'slow' to finish loading; the endpoints open only after that"
    )


def test_a_start_timed_out_with_every_model_loaded_names_the_silent_ports_or_the_health_check():
    log = recorded("start_with_failing_models.log")
    assert diagnostics.still_loading(log) == []
    assert (
        diagnostics.start_awaits(log, [8001, 8002], "127.0.0.1:8000")
        == "tritonserver to listen on port(s) 8001, 8002"
    )
    assert (
        diagnostics.start_awaits(log, [], "127.0.0.1:8000")
        == "GET /v2/health/live on 127.0.0.1:8000 to answer 200"
    )


# -- reloads in poll mode --------------------------------------------------------------------------


def test_a_polled_reload_is_seen_to_succeed_then_to_fail():
    log = recorded("poll_reloads.log")
    last = log.rindex('"loading: doubler:1"')
    succeeded, failing = log[:last], log[last:]
    just_started = failing.splitlines()[0]
    assert diagnostics.load_outcome(succeeded, "doubler") is True
    assert diagnostics.load_outcome(just_started, "doubler") is None
    assert diagnostics.still_loading(just_started) == ["doubler"]
    assert diagnostics.load_outcome(failing, "doubler") is False
    assert diagnostics.model_errors(failing, "doubler").startswith(
        "failed to load 'doubler' version 1: Internal: ImportError: gone"
    )
    assert diagnostics.load_outcome(log, "other") is None


# -- a dead stub -----------------------------------------------------------------------------------


def test_a_dead_stubs_answer_says_the_stub_did_not_answer_and_is_worth_retrying():
    from tritonclient.utils import InferenceServerException

    answer = recorded("dead_stub_answer.txt")
    assert answer == "Stub process 'doubler_0' is not healthy."
    assert not stub_answered(answer)
    assert stub_answered(None)
    assert stub_answered("model 'doubler': input column 'x' is missing")
    error, retryable = transport.mapped(
        InferenceServerException(answer, status="400"),
        url="127.0.0.1:8000",
        model="doubler",
        timeout_s=1.0,
    )
    assert isinstance(error, InferenceError)
    assert retryable


# -- stopping ---------------------------------------------------------------------------------


def test_a_stopping_server_has_answered_its_requests_once_it_starts_unloading_its_models():
    log = recorded("stop_after_stub_death.log")
    unloading = log.index("All models are stopped, unloading models")
    assert not diagnostics.requests_drained(log[:unloading])
    assert diagnostics.requests_drained(log)


def test_the_models_a_stopping_server_unloaded_are_read_from_its_log():
    log = recorded("stop_after_stub_death.log")
    stopping = log[log.index("Signal (2) received.") :]  # (the ensemble was reloaded before)
    assert diagnostics.unloaded(stopping) == {"reco", "doubler", "doubler-standby"}
    assert "doubler" not in diagnostics.unloaded(stopping[: stopping.index("unloaded 'doubler'")])
