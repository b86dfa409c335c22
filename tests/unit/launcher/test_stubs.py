"""Turning what the server and /proc say into a health report per model (no server needed)."""

import signal

from merlin_torch_serving.client.health import ModelStatus
from merlin_torch_serving.launcher.process import ProcessInfo
from merlin_torch_serving.launcher.stubs import StubRecord, assess, stub_of

STUB = "/cache/backends/python/triton_python_backend_stub"


def stub_process(pid, model, state="S", status=0, version=1):
    argv = (
        STUB,
        f"/repo/{model}/{version}/model.py",
        "shm_region",
        "1048576",
        "1048576",
        "99",
        "/lib",
        "336",
        f"{model}_0_0",
        "DEFAULT",
    )
    return ProcessInfo(pid=pid, parent=99, group=99, state=state, exit_status=status, argv=argv)


def zombie(pid, status):
    return ProcessInfo(pid=pid, parent=99, group=99, state="Z", exit_status=status, argv=())


READY = [ModelStatus("reco", 1, "READY"), ModelStatus("reco-0-step", 1, "READY")]


def test_a_stub_is_read_from_its_command_line():
    stub = stub_of(stub_process(7, "reco-0-step"))
    assert (stub.model, stub.version, stub.instance, stub.alive) == (
        "reco-0-step",
        1,
        "reco-0-step_0_0",
        True,
    )
    assert stub_of(ProcessInfo(8, 99, 99, "S", 0, ("/bin/sleep", "10"))) is None


def test_a_model_with_all_its_stubs_is_healthy_and_an_ensemble_has_none():
    live, deaths = StubRecord().update([stub_process(7, "reco-0-step")])
    report = assess(READY, {("reco-0-step", 1): 1}, live, deaths, {("reco-0-step", 1): 2})
    assert [(m.name, m.stubs_alive, m.healthy, m.failed_requests) for m in report] == [
        ("reco", None, True, None),
        ("reco-0-step", True, True, 2),
    ]


def test_a_stub_that_died_is_named_with_how_it_ended_once_it_was_seen():
    record = StubRecord()
    record.update([stub_process(7, "reco-0-step")])
    live, deaths = record.update([zombie(7, signal.SIGKILL)])  # a zombie has no command line left
    (step,) = [
        m
        for m in assess(READY, {("reco-0-step", 1): 1}, live, deaths, {})
        if m.name == "reco-0-step"
    ]
    assert (step.state, step.stubs_alive, step.healthy) == ("READY", False, False)
    assert step.last_error.startswith(
        "the stub of instance 'reco-0-step_0_0' (pid 7) killed by SIGKILL"
    )


def test_a_missing_stub_and_a_stopped_one_make_the_model_unhealthy():
    live, deaths = StubRecord().update([stub_process(7, "reco-0-step", state="T")])
    (step,) = [
        m
        for m in assess(READY, {("reco-0-step", 1): 2}, live, deaths, {})
        if m.name == "reco-0-step"
    ]
    assert step.stubs_alive is False
    assert "stopped" in step.last_error


def test_a_model_being_reloaded_is_reported_down_with_the_launchers_note():
    live, deaths = StubRecord().update([stub_process(8, "reco-0-step")])
    notes = {"reco-0-step": "being reloaded after: its stub died"}
    (step,) = [
        m
        for m in assess(
            READY, {("reco-0-step", 1): 1}, live, deaths, {}, notes, {}, {"reco-0-step"}
        )
        if m.name == "reco-0-step"
    ]
    assert (step.stubs_alive, step.last_error) == (False, "being reloaded after: its stub died")


def test_an_unavailable_model_reports_the_servers_reason():
    (model,) = assess([ModelStatus("broken", 1, "UNAVAILABLE", "failed to load")], {}, {}, {}, {})
    assert (model.healthy, model.last_error) == (False, "failed to load")


def test_a_model_whose_ensembles_run_its_standby_is_not_healthy_and_says_so():
    live, deaths = StubRecord().update([stub_process(8, "reco-0-step")])
    standbys = {"reco-0-step": "reco-0-step-standby"}
    report = assess(READY, {("reco-0-step", 1): 1}, live, deaths, {}, standbys=standbys)
    step = report[1]
    assert (step.stubs_alive, step.standby, step.healthy) == (True, "reco-0-step-standby", False)
    assert "its ensembles run its standby 'reco-0-step-standby' until it answers" in step.last_error
    assert report[0].healthy  # the ensemble itself answers
