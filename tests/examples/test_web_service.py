"""The web service example (examples/web_service) served by uvicorn in a process of its own, on a
port the OS assigns, in front of an ensemble on the shared tritonserver: a session's clicks posted
as JSON are answered with the top-k that ``Client`` answers for the same rows."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from merlin_torch_serving import Client
from tests import toy_session

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODEL = "toy-client"  # the toy graph the clients' tests serve (tests/conftest.py)
STARTED = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
START_TIMEOUT_S = 120.0


class Uvicorn:
    """``uvicorn examples.web_service.app:app`` on 127.0.0.1 and a port the OS picks, its log
    kept; stopped with Ctrl-C (the app's shutdown closes its client)."""

    def __init__(self, environment: dict[str, str]):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "examples.web_service.app:app"]
            + ["--host", "127.0.0.1", "--port", "0"],
            cwd=ROOT,
            env={**os.environ, **environment},
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)

    def url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in list(self.log):
                if found := STARTED.search(line):
                    return f"http://127.0.0.1:{found.group(1)}"
            time.sleep(0.05)
        pytest.fail(f"uvicorn did not start within {START_TIMEOUT_S:g} s:\n{''.join(self.log)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._reader.join(10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return self.process.returncode


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def test_the_web_service_answers_a_sessions_clicks_with_the_top_k_client_answers(
    triton_server, toy_client
):
    # one start of the service (its imports take seconds): gRPC, its default; AsyncClient's two
    # protocols are compared with Client's in tests/integration
    url, protocol = triton_server.grpc_url, "grpc"
    rows = toy_session.interactions(4, seed=31, first_session=9000)
    service = Uvicorn({"MTS_URL": url, "MTS_MODEL": MODEL, "MTS_PROTOCOL": protocol})
    try:
        base = service.url()
        with urllib.request.urlopen(base + "/health", timeout=30) as health:
            assert json.load(health) == {"ready": True}
        with Client(url, protocol) as client:
            for session_id, clicks in rows.groupby("session_id", sort=False):
                body = {
                    "session_id": int(session_id),
                    "clicks": clicks[["item_id", "category", "timestamp"]].to_dict("records"),
                }
                status, answer = post(base + "/recommendations", body)
                expected = client.infer(MODEL, clicks)
                assert status == 200, answer
                assert answer == {
                    "session_id": int(session_id),
                    "item_ids": expected["item_ids"][0].tolist(),
                    "scores": expected["item_scores"][0].tolist(),
                }
        status, refused = post(base + "/recommendations", {"session_id": 1, "clicks": []})
        assert status == 422
        assert refused["detail"][0]["loc"] == ["body", "clicks"]
    finally:
        returncode = service.stop()
    assert returncode == 0, "".join(service.log)
    assert "Application shutdown complete" in "".join(service.log)
