"""A failover standby's folder: a copy of its model's that only the launcher changes, so that
tritonserver never finds it changed when an ensemble is switched to it (no server needed)."""

from __future__ import annotations

import json
import os
import time

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.export import config as configs
from merlin_torch_serving.launcher import standby

STEP = "reco-0-workflow"
CONFIG = {
    "backend": "python",
    "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    "input": [{"name": "item_id", "data_type": "TYPE_INT64", "dims": ["-1"]}],
}


def model_folder(repository):
    (repository / STEP / "1" / "ops" / "0").mkdir(parents=True)
    (repository / STEP / "1" / "model.py").write_text("# the step")
    (repository / STEP / "1" / "ops" / "0" / "vocabulary.parquet").write_bytes(b"items")
    (repository / STEP / "warmup").mkdir()
    (repository / STEP / "config.pbtxt").write_text(f"name: '{STEP}'")
    (repository / STEP / standby.OVERRIDES_FILE).write_text("{}\n")
    return repository / STEP


def newest_change(folder) -> int:
    """The latest modification or change time under ``folder``, following links, as tritonserver
    reads a model folder to tell whether it changed."""

    def changed(path) -> int:
        status = os.stat(path)
        return max(status.st_mtime_ns, status.st_ctime_ns)

    times = [changed(folder)]
    for root, dirs, files in os.walk(folder, followlinks=True):
        times += [changed(os.path.join(root, name)) for name in dirs + files]
    return max(times)


def test_standbys_are_named_after_their_model_and_numbered_when_made_anew():
    assert standby.standby_name(STEP) == "reco-0-workflow-standby"
    assert standby.standby_name(STEP, 2) == "reco-0-workflow-standby-2"
    assert [standby.model_of(n) for n in ("a-standby", "a-standby-3", "a", "a-standby-x")] == [
        "a",
        "a",
        None,
        None,
    ]
    assert standby.is_standby("a-standby-3")
    assert not standby.is_standby("a-standbys")


def test_the_standby_copies_the_models_files_and_has_a_config_of_its_own(tmp_path):
    model = model_folder(tmp_path / "repository")
    folder = standby.write_standby(
        tmp_path / "repository", tmp_path / "side", STEP, CONFIG, "reco-0-workflow-standby"
    )
    assert (folder / "1" / "model.py").read_text() == "# the step"
    assert (folder / "1" / "ops" / "0" / "vocabulary.parquet").read_bytes() == b"items"
    assert not os.path.islink(folder / "1")
    assert (folder / "warmup").is_dir()
    # the same bytes, not a second copy of them
    assert os.path.samefile(folder / "1" / "model.py", model / "1" / "model.py")
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert (config.name, config.backend) == ("reco-0-workflow-standby", "python")


def test_reloading_the_model_or_giving_it_new_weights_leaves_its_standby_unchanged(tmp_path):
    model = model_folder(tmp_path / "repository")
    model_before = newest_change(model)
    folder = standby.write_standby(tmp_path / "repository", tmp_path / "side", STEP, CONFIG, "s")
    assert newest_change(model) == model_before  # making it changes nothing of the model's
    # nor does making the next one change this one
    standby.write_standby(tmp_path / "repository", tmp_path / "side", STEP, CONFIG, "s-1")
    before = newest_change(folder)
    time.sleep(0.01)
    os.utime(model / "1")  # what TritonServer.reload does to the model
    # what routing.set_weights does: a new file in place of the old one
    (model / ".new").write_text(json.dumps({"1": {"weights": {"a": 1.0}}}))
    os.replace(model / ".new", model / standby.OVERRIDES_FILE)
    assert newest_change(folder) == before
    assert json.loads((folder / standby.OVERRIDES_FILE).read_text()) == {}


def test_the_fingerprint_changes_with_the_files_and_not_with_a_touched_folder(tmp_path):
    model = model_folder(tmp_path / "repository")
    first = standby.fingerprint(tmp_path / "repository", STEP)
    os.utime(model / "1")
    (model / "config.pbtxt").write_text(f"name: '{STEP}'\nmax_batch_size: 0")
    assert standby.fingerprint(tmp_path / "repository", STEP) == first
    (model / ".new").write_text("{}\n")
    os.replace(model / ".new", model / standby.OVERRIDES_FILE)
    assert standby.fingerprint(tmp_path / "repository", STEP) != first
    assert standby.fingerprint("s3://bucket/repository", STEP) == ()


def test_the_overrides_file_name_is_the_exporters():
    assert standby.OVERRIDES_FILE == configs.CONFIG_OVERRIDES_FILE
