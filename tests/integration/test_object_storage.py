"""Export to s3:// on a local S3-compatible server (moto's), read it back, and serve it from there
with the bundled tritonserver, which reads s3:// repositories itself."""

import json
import os

import numpy as np
import pytest

from merlin_torch_serving import Client, Ensemble, ExportError, TritonServer
from tests import toy_session
from tests.object_store import CREDENTIALS, start_local_s3

pytestmark = pytest.mark.integration

BUCKET = "models-bucket"


@pytest.fixture(scope="module")
def local_s3(tmp_path_factory):
    process, s3 = start_local_s3(tmp_path_factory.mktemp("moto") / "moto.log")
    saved = {key: os.environ.get(key) for key in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        s3.filesystem().mkdir(BUCKET)
        yield s3
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        process.kill()
        process.wait(30)


@pytest.fixture(scope="module")
def toy_ensemble(toy_workflow, toy_model):
    return Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, k=4), toy_workflow.input_schema
    )


def remote_files(fs, root):
    return sorted(path[len(root) + 1 :] for path in fs.find(root))


def test_export_to_s3_writes_the_repository_there_and_no_local_folder(
    local_s3, toy_ensemble, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    url = f"s3://{BUCKET}/plain"
    result = toy_ensemble.export(url, "reco", storage_options=local_s3.storage_options)
    local = toy_ensemble.export(tmp_path / "local", "reco")

    assert result.path == url
    assert result.models == local.models
    assert not any("s3:" in str(path) for path in tmp_path.rglob("*")), (
        "a local 's3:' folder was created"
    )
    fs = local_s3.filesystem()
    root = f"{BUCKET}/plain"
    local_files = sorted(
        p.relative_to(tmp_path / "local").as_posix()
        for p in (tmp_path / "local").rglob("*")
        if p.is_file()
    )
    assert remote_files(fs, root) == local_files
    # files that two exports write alike (pickles, their hashes in step.json, and manifests differ
    # run to run)
    deterministic = [
        f for f in local_files if f.endswith(("config.pbtxt", "model.py")) or "/warmup/" in f
    ]
    assert len(deterministic) >= 6
    for relative in deterministic:
        assert fs.cat_file(f"{root}/{relative}") == (tmp_path / "local" / relative).read_bytes(), (
            relative
        )
    for relative in (f for f in local_files if f.endswith("step.json")):
        uploaded, written = (
            json.loads(fs.cat_file(f"{root}/{relative}")),
            json.loads((tmp_path / "local" / relative).read_bytes()),
        )
        assert uploaded.keys() == written.keys(), relative
        assert uploaded["calls"] == written["calls"], relative
        assert uploaded["artifacts"].keys() == written["artifacts"].keys(), relative


def test_export_to_s3_adds_versions_and_overwrites_like_a_local_export(local_s3, toy_ensemble):
    fs = local_s3.filesystem()
    url, root = f"s3://{BUCKET}/versions", f"{BUCKET}/versions"
    toy_ensemble.export(url, "reco", storage_options=local_s3.storage_options)
    with pytest.raises(ExportError, match="already holds model"):
        toy_ensemble.export(url, "reco", storage_options=local_s3.storage_options)

    second = toy_ensemble.export(
        url, "reco", add_version=True, storage_options=local_s3.storage_options
    )
    assert second.version == 2
    assert {f.split("/")[1] for f in remote_files(fs, root) if f.startswith("reco/")} >= {
        "1",
        "2",
        "config.pbtxt",
    }

    third = toy_ensemble.export(
        url, "reco", overwrite=True, storage_options=local_s3.storage_options
    )
    assert third.version == 1
    versions = {f.split("/")[1] for f in remote_files(fs, root) if f.split("/")[1].isdigit()}
    assert versions == {"1"}


def test_a_repository_exported_to_s3_serves_from_s3_and_answers_as_in_process(
    local_s3, toy_ensemble, tmp_path
):
    toy_ensemble.export(f"s3://{BUCKET}/served", "reco", storage_options=local_s3.storage_options)
    rows = toy_session.interactions(6, seed=61, first_session=9100)
    server = TritonServer(
        local_s3.triton_url(f"{BUCKET}/served"), start_timeout_s=180, failover=True
    )
    with server:
        assert [m.state for m in server.models()][:2] == ["READY"] * 2
        answer = Client(server.grpc_url).infer("reco", rows)
        # the standby of its python step is downloaded from the store into the server's own
        # second repository
        (step,) = server.wait_for_failover()
        assert Client(server.grpc_url).infer("reco", rows).equals(answer)
        assert f"{step}-standby" in [m.name for m in server.models() if m.state == "READY"]
    expected = toy_ensemble.transform(rows)
    for column in expected.columns:
        for got, want in zip(answer[column], expected[column], strict=True):
            np.testing.assert_array_equal(got, want, err_msg=column)


def test_export_to_a_protocol_without_its_filesystem_names_what_to_install(toy_ensemble):
    with pytest.raises(
        ExportError, match=r"cannot export to 'nosuchfs://x'.*install the filesystem"
    ):
        toy_ensemble.export("nosuchfs://x", "reco")
