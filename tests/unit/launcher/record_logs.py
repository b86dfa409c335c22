"""Record the tritonserver logs and answers under logs/ that test_diagnostics.py reads.

Run ``./run python -m tests.unit.launcher.record_logs`` to record them again (e.g. for a new
tritonserver): it starts the real server once per situation, in a temporary repository whose
path is written as /srv/models, and this interpreter's prefix as /home/user/.venv.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from merlin_torch_serving.exceptions import MerlinTorchServingError
from merlin_torch_serving.launcher.admin import Admin, Refused
from merlin_torch_serving.launcher.process import children_of
from merlin_torch_serving.launcher.server import TritonServer
from tests.triton_models import write_doubler, write_invalid_config, write_onnx_model

LOGS = Path(__file__).parent / "logs"
REPOSITORY = "/srv/models"
PREFIX = "/home/user/.venv"


def write_ensemble(repository: Path, name: str, step: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        'input [{ name: "x" data_type: TYPE_INT64 dims: [-1] }]\n'
        'output [{ name: "y" data_type: TYPE_INT64 dims: [-1] }]\n'
        f'ensemble_scheduling {{ step [{{ model_name: "{step}" model_version: -1 '
        'input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } }] }\n'
    )


class Recorder:
    """Runs each situation in a fresh repository and writes what the server said.

    Paths in it are shortened.
    """

    def __init__(self, root: Path):
        self._root = root

    def situation(
        self, name: str, run: Callable[[Path, Path], None], *, keep_log: bool = True
    ) -> None:
        repository = self._root / name / "models"
        repository.mkdir(parents=True)
        log = self._root / name / "server.log"
        # the error is the situation; the log says what the server did
        with contextlib.suppress(MerlinTorchServingError):
            run(repository, log)
        if keep_log:
            self.write(f"{name}.log", log.read_text(), repository)
        print(f"recorded {name}", flush=True)

    def write(self, file_name: str, text: str, repository: Path) -> None:
        text = text.replace(str(repository.resolve()), REPOSITORY).replace(
            str(repository), REPOSITORY
        )
        (LOGS / file_name).write_text(text.replace(sys.prefix, PREFIX))


def answer(refused: Callable[[], None]) -> str:
    """The server's answer to a load it refused, as the launcher reads it."""
    try:
        refused()
    except Refused as refusal:
        return refusal.reason
    raise AssertionError("the server did not refuse")


def record(root: Path) -> None:
    recorder = Recorder(root)

    for protocol in ("http", "grpc", "metrics"):

        def port_in_use(repository: Path, log: Path, protocol: str = protocol) -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
                taken.bind(("", 0))
                taken.listen()
                port = {f"{protocol}_port": taken.getsockname()[1]}
                TritonServer(repository, model_control="explicit", log_path=log, **port).start()

        recorder.situation(f"port_in_use_{protocol}", port_in_use)

    def rejected_argument(repository: Path, log: Path) -> None:
        TritonServer(repository, extra_args=["--no-such-option"], log_path=log).start()

    recorder.situation("rejected_argument", rejected_argument)

    def start_with_failing_models(repository: Path, log: Path) -> None:
        write_doubler(repository, "good")
        write_doubler(
            repository, "fails_in_initialize", initialize="raise RuntimeError('checkpoint missing')"
        )
        write_invalid_config(repository, "invalid_config")
        write_onnx_model(repository, "needs_onnx")
        TritonServer(repository, log_path=log).start()

    recorder.situation("start_with_failing_models", start_with_failing_models)

    def still_loading(repository: Path, log: Path) -> None:
        write_doubler(repository, "quick")
        write_doubler(repository, "slow", initialize="time.sleep(120)")
        TritonServer(repository, start_timeout_s=5.0, log_path=log).start()

    recorder.situation("still_loading", still_loading)

    def explicit_loads(repository: Path, log: Path) -> None:
        write_invalid_config(repository, "invalid_config")
        write_onnx_model(repository, "needs_onnx")
        write_ensemble(repository, "reco", "needs_onnx")
        write_doubler(repository, "broken_step", initialize="raise ValueError('no weights here')")
        write_ensemble(repository, "reco_over_broken_step", "broken_step")
        with TritonServer(repository, model_control="explicit", log_path=log) as server:
            admin = Admin(server.http_url)
            for model in ("invalid_config", "not_written", "reco", "reco_over_broken_step"):
                refusal = answer(lambda model=model: admin.load(model, 60.0))
                recorder.write(f"load_answer_{model}.txt", refusal, repository)

    recorder.situation("explicit_loads", explicit_loads)

    def poll_reloads(repository: Path, log: Path) -> None:
        write_doubler(repository, "doubler")
        with TritonServer(
            repository, model_control="poll", poll_interval_s=1, log_path=log
        ) as server:
            server.reload("doubler")
            write_doubler(repository, "doubler", initialize="raise ImportError('gone')")
            server.reload("doubler")

    recorder.situation("poll_reloads", poll_reloads)

    def dead_stub(repository: Path, log: Path) -> None:
        write_doubler(repository, "doubler")
        with TritonServer(repository, restart_failed_models=False, log_path=log) as server:
            for stub in children_of(server.pid):
                os.kill(stub.pid, signal.SIGKILL)
            time.sleep(1.0)
            client = httpclient.InferenceServerClient(server.http_url)
            request = httpclient.InferInput("x", [2], "INT64")
            request.set_data_from_numpy(np.array([1, 2], dtype=np.int64))
            try:
                client.infer("doubler", [request])
            except InferenceServerException as error:
                recorder.write("dead_stub_answer.txt", error.message(), repository)
            else:
                raise AssertionError("a model whose stub was killed answered")
            finally:
                client.close()

    recorder.situation("dead_stub", dead_stub, keep_log=False)

    def stop_after_stub_death(repository: Path, log: Path) -> None:
        # a step's stub killed, the step repaired, then tritonserver's own stop (SIGINT)
        write_doubler(repository, "doubler")
        write_ensemble(repository, "reco", "doubler")
        server = TritonServer(repository, failover=True, log_path=log, stop_timeout_s=20)
        with server:
            server.wait_for_failover()
            (stub, *_) = [p.pid for p in children_of(server.pid) if "/doubler/" in " ".join(p.argv)]
            os.kill(stub, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not any(m.name == "doubler" and m.restarts for m in server.health()):
                assert time.monotonic() < deadline, "the doubler was not repaired within 60 s"
                time.sleep(0.2)
            os.kill(server.pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while server.is_running and time.monotonic() < deadline:
                time.sleep(0.2)

    recorder.situation("stop_after_stub_death", stop_after_stub_death)


if __name__ == "__main__":
    LOGS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tritonserver-logs-") as root:
        record(Path(root))
