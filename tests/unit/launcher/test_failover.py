"""Failover's pieces that need no server: the configs it loads, the standby's folder, and when
a server runs it."""

from __future__ import annotations

import pytest

from merlin_torch_serving.launcher import failover
from merlin_torch_serving.launcher.config import ServerConfig
from merlin_torch_serving.launcher.server import TritonServer

PYTHON_STEP = {
    "name": "reco-0-workflow",
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "item_id", "data_type": "TYPE_INT64", "dims": ["-1"]}],
    "output": [{"name": "item_id-list__values", "data_type": "TYPE_INT64", "dims": ["-1"]}],
    "instance_group": [{"name": "reco-0-workflow_0", "kind": "KIND_CPU", "count": 1}],
}
ENSEMBLE = {
    "name": "reco",
    "platform": "ensemble",
    "ensemble_scheduling": {
        "step": [
            {"model_name": "reco-0-workflow", "model_version": "-1"},
            {"model_name": "reco-1-predict", "model_version": "-1"},
        ]
    },
}


def test_a_python_model_runs_two_instances_and_its_standby_one():
    assert failover.with_instances(PYTHON_STEP, 2)["instance_group"][0]["count"] == 2
    assert failover.with_instances(PYTHON_STEP, 1)["instance_group"][0]["kind"] == "KIND_CPU"
    assert PYTHON_STEP["instance_group"][0]["count"] == 1  # the given config is left alone


def test_switching_an_ensemble_replaces_only_the_steps_that_run_the_model():
    renamed = {"reco-0-workflow": "reco-0-workflow-standby"}
    switched = failover.with_steps_renamed(ENSEMBLE, renamed)
    names = [step["model_name"] for step in switched["ensemble_scheduling"]["step"]]
    assert names == ["reco-0-workflow-standby", "reco-1-predict"]
    assert failover.with_steps_renamed(ENSEMBLE, {"other": "other-standby"}) is None


def test_the_standbys_an_ensemble_runs_are_found_in_its_config_whatever_their_number():
    switched = failover.with_steps_renamed(
        ENSEMBLE, {"reco-0-workflow": "reco-0-workflow-standby-2"}
    )
    assert failover.standby_steps(switched) == {"reco-0-workflow-standby-2": "reco-0-workflow"}
    assert failover.standby_steps(ENSEMBLE) == {}


def test_failover_is_on_by_default_and_off_where_it_cannot_work(tmp_path, monkeypatch):
    monkeypatch.delenv("MTS_FAILOVER", raising=False)
    assert TritonServer(tmp_path).config.failover
    assert not TritonServer(tmp_path, failover=False).config.failover
    # the load API it switches with is closed in poll mode
    assert not ServerConfig(tmp_path, model_control="poll").failover
    assert ServerConfig("s3://bucket/repository").failover


@pytest.mark.parametrize("value", ["0", "false", "off", "No"])
def test_the_environment_turns_the_default_off(tmp_path, monkeypatch, value):
    monkeypatch.setenv("MTS_FAILOVER", value)
    assert not TritonServer(tmp_path).config.failover
    assert TritonServer(tmp_path, failover=True).config.failover


def test_the_standby_repository_is_a_second_model_repository(tmp_path):
    from pathlib import Path

    from merlin_torch_serving.launcher.config import Ports

    command = ServerConfig(tmp_path).command(
        Path("/bin/tritonserver"), Path("/b"), Ports(1, 2, 3), None, tmp_path / "standbys"
    )
    repositories = [a for a in command if a.startswith("--model-repository=")]
    assert repositories == [
        f"--model-repository={tmp_path.resolve()}",
        f"--model-repository={tmp_path / 'standbys'}",
    ]
