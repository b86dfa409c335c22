"""Failover's pieces that need no server: the configs it loads, the standby's folder, and when
a server runs it."""

from __future__ import annotations

import os

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

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
    switched = failover.switched_steps(ENSEMBLE, "reco-0-workflow", "reco-0-workflow-standby")
    names = [step["model_name"] for step in switched["ensemble_scheduling"]["step"]]
    assert names == ["reco-0-workflow-standby", "reco-1-predict"]
    assert failover.switched_steps(ENSEMBLE, "other", "other-standby") is None


def test_the_standby_links_the_models_folders_and_has_a_config_of_its_own(tmp_path):
    repository, side = tmp_path / "repository", tmp_path / "standbys"
    (repository / "reco-0-workflow" / "1").mkdir(parents=True)
    (repository / "reco-0-workflow" / "1" / "model.py").write_text("# the step")
    (repository / "reco-0-workflow" / "warmup").mkdir()
    (repository / "reco-0-workflow" / "config.pbtxt").write_text("name: 'reco-0-workflow'")
    folder = failover.write_standby(repository, side, "reco-0-workflow", PYTHON_STEP)
    assert folder == side / "reco-0-workflow-standby"
    assert (folder / "1" / "model.py").read_text() == "# the step"
    assert os.path.islink(folder / "1")
    assert os.path.islink(folder / "warmup")
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert config.name == "reco-0-workflow-standby"
    assert [group.count for group in config.instance_group] == [1]
    assert config.backend == "python"


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
