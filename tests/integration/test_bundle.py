"""A bundled repository serves on the bundled tritonserver started from an interpreter and a PATH
that cannot import merlin_torch_serving, with a python backend whose default stub is built for
another Python (3.12, as in NVIDIA's 25.x containers), and answers exactly as in-process."""

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest

from merlin_torch_serving import BundleError, Client, Ensemble
from merlin_torch_serving.backends.bundle import (
    bundled_tritonserver,
    pytriton_libraries,
    pytriton_server_root,
)
from merlin_torch_serving.backends.layout import STUB_NAME
from merlin_torch_serving.bundling import bundle_repository, pack_environment
from merlin_torch_serving.bundling.repository import ENV_FOLDER
from merlin_torch_serving.export import config as configs
from tests import toy_session
from tests.session_models import SERVED_TORCH_THREADS, torch_threads

pytestmark = pytest.mark.integration

SYSTEM_PATH = "/usr/bin:/bin"
# a launcher with no site-packages, no user site and no environment variables of ours
LAUNCHER = ["/usr/bin/python3", "-I", "-c", "import os, sys; os.execv(sys.argv[1], sys.argv[1:])"]


@pytest.fixture(scope="module")
def packed_environment(tmp_path_factory):
    """The serving environment of this Python, packed once (hard links: ~10 s)."""
    return pack_environment(tmp_path_factory.mktemp("packed") / "env")


@pytest.fixture(scope="module")
def bundled(tmp_path_factory, toy_workflow, toy_model, packed_environment):
    ensemble = Ensemble(
        toy_session.session_graph(toy_workflow, toy_model, backend="python", k=5),
        toy_workflow.input_schema,
    )
    folder = tmp_path_factory.mktemp("bundle")
    ensemble.export(folder / "repository", "reco")
    result = bundle_repository(
        folder / "repository", folder / "bundle", environment=packed_environment.path
    )
    return ensemble, result


@pytest.fixture(scope="module")
def foreign_python_backend(tmp_path_factory):
    """The bundled python backend, with the Python 3.12 stub as its default.

    Only a model's own stub runs Python 3.11.
    """
    backends = tmp_path_factory.mktemp("backends")
    shutil.copytree(
        pytriton_server_root() / "backends" / "python",
        backends / "python",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy2(
        pytriton_server_root() / "python_backend_stubs" / "3.12" / STUB_NAME,
        backends / "python" / STUB_NAME,
    )
    return backends


def test_the_launch_environment_cannot_import_the_library(tmp_path):
    # from a folder without the sources, as the server runs (a source checkout in the working
    # directory would be importable)
    checked = subprocess.run(
        [*LAUNCHER[:2], "-c", "import merlin_torch_serving"],
        env={"PATH": SYSTEM_PATH},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert checked.returncode != 0
    assert "No module named 'merlin_torch_serving'" in checked.stderr
    on_path = subprocess.run(
        ["bash", "-c", "python3 -c 'import merlin_torch_serving'"],
        env={"PATH": SYSTEM_PATH},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert on_path.returncode != 0, "the python3 on the server's PATH must not have the library"


def test_a_bundle_gives_each_python_step_the_environment_its_stub_and_execution_env_path(bundled):
    _, result = bundled
    (step,) = result.python_steps
    step_dir = result.path / step
    assert (step_dir / ENV_FOLDER / "bin" / "activate").is_file()
    assert (
        step_dir / ENV_FOLDER / "lib" / "python3.11" / "site-packages" / "merlin_torch_serving"
    ).is_dir()
    assert os.access(step_dir / "triton_python_backend_stub", os.X_OK)
    config = configs.from_pbtxt((step_dir / "config.pbtxt").read_text())
    assert (
        config.parameters["EXECUTION_ENV_PATH"].string_value
        == f"$$TRITON_MODEL_DIRECTORY/{ENV_FOLDER}"
    )
    assert not any(
        name.startswith("nvidia-pytriton") for name in result.environment.distributions
    ), "serving needs no launcher"


def test_a_bundle_serves_where_python_lacks_the_library_and_answers_as_in_process(
    bundled, foreign_python_backend, tmp_path
):
    ensemble, result = bundled
    ports = free_ports(3)
    log_path = tmp_path / "tritonserver.log"
    command = [
        *LAUNCHER,
        str(bundled_tritonserver()),
        f"--model-repository={result.path}",
        f"--backend-directory={foreign_python_backend}",
        f"--http-port={ports[0]}",
        f"--grpc-port={ports[1]}",
        f"--metrics-port={ports[2]}",
        f"--backend-config=python,shm-region-prefix-name=mts_bundle_test_{os.getpid()}_",
    ]
    # only the wheel's own libraries: no libpython of this interpreter, no virtualenv
    environment = {
        "PATH": SYSTEM_PATH,
        "LD_LIBRARY_PATH": str(pytriton_libraries()),
        "HOME": str(tmp_path),
    }
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            command,
            env=environment,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_ready(server, ports[0], log_path)
        rows = toy_session.interactions(9, seed=71, first_session=9300).sample(
            frac=1.0, random_state=2
        )
        answer = Client(f"127.0.0.1:{ports[0]}", protocol="http").infer("reco", rows)
        with torch_threads(SERVED_TORCH_THREADS):
            expected = ensemble.transform(rows)
        for column in expected.columns:
            for got, want in zip(answer[column], expected[column], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=column)
        assert "python_env" not in log_path.read_text(), (
            "a folder environment is used in place, never extracted"
        )
    finally:
        stop(server)


def test_bundling_refuses_an_existing_target_and_a_repository_without_python_steps(
    bundled, tmp_path
):
    _, result = bundled
    with pytest.raises(BundleError, match="already exists; remove it or bundle into a new folder"):
        bundle_repository(result.path, result.path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="has no python-backend model"):
        bundle_repository(tmp_path / "empty", tmp_path / "out")


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def wait_until_ready(server, http_port, log_path, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(
                f"tritonserver exited with {server.returncode}:\n{log_path.read_text()[-6000:]}"
            )
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2
            ) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(
        f"tritonserver was not ready after {timeout_s} s:\n{log_path.read_text()[-6000:]}"
    )


def stop(server):
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
