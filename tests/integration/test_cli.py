"""The command line: serve in the foreground, infer from a file, list models, stop on Ctrl-C."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from merlin_torch_serving import Client, Ensemble
from merlin_torch_serving.client import chunks
from merlin_torch_serving.data import frames, tables
from tests import toy_session

pytestmark = pytest.mark.integration

SERVER_ID = "cli-test-server"


def run_cli(*args, timeout_s=120):
    return subprocess.run(
        [sys.executable, "-m", "merlin_torch_serving", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def read_until(process, pattern, timeout_s=180):
    """Lines of the process's stdout up to the first that matches ``pattern``."""
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(
        f"no line matching {pattern!r} within {timeout_s} s; got:\n{''.join(lines)}"
    )


@pytest.fixture(scope="module")
def ensemble(toy_workflow, toy_model):
    return Ensemble(toy_session.session_graph(toy_workflow, toy_model), toy_workflow.input_schema)


@pytest.fixture(scope="module")
def served_repository(tmp_path_factory, ensemble):
    repository = tmp_path_factory.mktemp("cli") / "repository"
    ensemble.export(repository, "reco")  # ModelOptions' default: at most 100,000 rows per request
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "merlin_torch_serving",
            "serve",
            str(repository),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--",
            f"--id={SERVER_ID}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = read_until(process, "press Ctrl-C to stop")
        urls = dict(re.findall(r"^\s+(gRPC|HTTP)\s+(\S+)$", "".join(lines), flags=re.M))
        yield process, urls, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_serve_prints_urls_and_the_loaded_models(served_repository):
    _, urls, output = served_repository
    assert set(urls) == {"gRPC", "HTTP"}
    assert re.search(r"^reco\s+1\s+READY\s+-\s+0$", output, flags=re.M)  # an ensemble has no stub


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_infer_sends_a_file_of_rows_and_prints_one_line_per_session(
    served_repository, tmp_path, suffix
):
    _, urls, _ = served_repository
    rows = toy_session.interactions(3, seed=31, first_session=4200)
    path = tmp_path / f"rows{suffix}"
    rows.to_csv(path, index=False) if suffix == ".csv" else rows.to_parquet(path)

    result = run_cli("infer", "reco", str(path), "--url", urls["gRPC"])

    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["session_id", "item_ids", "item_scores"]
    assert [int(line.split()[0]) for line in lines[1:]] == list(pd.unique(rows["session_id"]))


def test_infer_writes_the_answer_to_a_file(served_repository, tmp_path):
    _, urls, _ = served_repository
    rows = toy_session.interactions(2, seed=32)
    rows.to_parquet(tmp_path / "rows.parquet")
    result = run_cli(
        "infer",
        "reco",
        str(tmp_path / "rows.parquet"),
        "--url",
        urls["HTTP"],
        "--protocol",
        "http",
        "-o",
        str(tmp_path / "answer.parquet"),
    )
    assert result.returncode == 0, result.stderr
    answer = pd.read_parquet(tmp_path / "answer.parquet")
    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))
    assert all(len(ids) == 3 for ids in answer["item_ids"])


def test_infer_reports_a_bad_request_as_an_error_naming_the_column(served_repository, tmp_path):
    _, urls, _ = served_repository
    toy_session.interactions(2).drop(columns=["category"]).to_parquet(tmp_path / "bad.parquet")
    result = run_cli("infer", "reco", str(tmp_path / "bad.parquet"), "--url", urls["gRPC"])
    assert result.returncode == 1
    assert "missing input columns: 'category' (int64 scalar)" in result.stderr


def test_models_lists_versions_states_and_whether_stubs_answer(served_repository):
    _, urls, _ = served_repository
    result = run_cli("models", "--url", urls["gRPC"])
    assert result.returncode == 0, result.stderr
    assert re.search(r"^reco-0-\S+\s+1\s+READY\s+alive\s+\d+$", result.stdout, flags=re.M)


# --- mistakes a new user makes: the first line of the error says what to do, no traceback ------


def first_error_line(result) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_url_with_a_scheme_is_refused_naming_the_address_to_pass(served_repository):
    _, urls, _ = served_repository
    result = run_cli("models", "--url", f"http://{urls['HTTP']}", "--protocol", "http")
    assert (
        first_error_line(result)
        == f"error: drop the scheme: Client('{urls['HTTP']}', protocol='http') (--url"
        f" {urls['HTTP']}): the address must be host:port (got 'http://{urls['HTTP']}')"
    )
    assert "_closed" not in result.stderr


@pytest.mark.parametrize(
    ("protocol", "port", "other"), [("http", "gRPC", "grpc"), ("grpc", "HTTP", "http")]
)
def test_the_wrong_protocol_for_the_port_names_the_other_protocol(
    served_repository, protocol, port, other
):
    _, urls, _ = served_repository
    result = run_cli("models", "--url", urls[port], "--protocol", protocol)
    assert (
        first_error_line(result)
        == f"error: {urls[port]} does not answer {protocol}: it looks like tritonserver's {other}"
        f" port; pass protocol='{other}' (--protocol {other}) or the server's {protocol} port"
    )


@pytest.mark.parametrize("command", ["models", "infer"])
def test_no_server_running_says_to_start_serve_or_pass_the_url(tmp_path, command):
    toy_session.interactions(2).to_parquet(tmp_path / "rows.parquet")
    arguments = (
        ("infer", "reco", str(tmp_path / "rows.parquet"), "--wait", "1")
        if command == "infer"
        else ("models",)
    )
    result = run_cli(*arguments, "--url", f"127.0.0.1:{free_port()}")
    assert first_error_line(result).startswith(
        "error: start a server (`merlin-torch-serving serve REPOSITORY`, or"
        " TritonServer(repository)) or pass the address of a running one (--url HOST:PORT,"
        " Client(url))"
    )


def test_an_unknown_model_lists_the_models_the_server_has(served_repository, tmp_path):
    _, urls, _ = served_repository
    toy_session.interactions(2).to_parquet(tmp_path / "rows.parquet")
    result = run_cli(
        "infer", "recommendations", str(tmp_path / "rows.parquet"), "--url", urls["gRPC"]
    )
    line = first_error_line(result)
    assert line.startswith("error: use one of the models this server has: 'reco', 'reco-0-")
    assert line.endswith("; it has no model 'recommendations'")


def test_a_taken_port_is_found_before_any_model_loads_and_port_0_is_advised(served_repository):
    served = re.search(r"starting tritonserver on (\S+):", served_repository[2]).group(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "serve",
            served,
            "--grpc-port",
            str(port),
            "--http-port",
            "0",
            "--metrics-port",
            "0",
            "--verbose",
        )
    assert (
        first_error_line(result)
        == "error: pass --grpc-port 0 (the OS picks a free port, printed when ready) or another"
        f" free port: the gRPC port {port} is already in use"
    )
    assert len(result.stderr.strip().splitlines()) == 1  # no tritonserver log: none was started


def test_serve_given_the_folder_above_a_repository_names_the_repository(served_repository):
    served = Path(re.search(r"starting tritonserver on (\S+):", served_repository[2]).group(1))
    result = run_cli(
        "serve", str(served.parent), "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0"
    )
    assert (
        first_error_line(result)
        == f"error: serve the repository itself, {str(served)!r}: {str(served.parent)!r} holds a"
        " model repository, not model folders"
    )


def test_integer_ids_stored_as_whole_floats_are_accepted(served_repository, ensemble, tmp_path):
    _, urls, _ = served_repository
    rows = toy_session.interactions(3, seed=33)
    rows.astype({"item_id": "float64", "session_id": "float64"}).to_csv(
        tmp_path / "rows.csv", index=False
    )
    result = run_cli(
        "infer",
        "reco",
        str(tmp_path / "rows.csv"),
        "--url",
        urls["gRPC"],
        "-o",
        str(tmp_path / "answer.parquet"),
    )
    assert result.returncode == 0, result.stderr
    answer = pd.read_parquet(tmp_path / "answer.parquet")
    expected = ensemble.transform(rows)
    assert answer["session_id"].tolist() == expected["session_id"].tolist()
    np.testing.assert_array_equal(np.stack(answer["item_ids"]), np.stack(expected["item_ids"]))


def test_renamed_columns_are_all_named_with_the_fix_and_then_mapped(
    served_repository, ensemble, tmp_path
):
    _, urls, _ = served_repository
    rows = toy_session.interactions(3, seed=34)
    renamed = rows.rename(columns={"session_id": "user_session", "item_id": "product_id"})
    renamed.to_parquet(tmp_path / "rows.parquet")

    refused = run_cli("infer", "reco", str(tmp_path / "rows.parquet"), "--url", urls["gRPC"])
    assert (
        first_error_line(refused)
        == "error: name the request's columns as the model's inputs, or map yours to them: "
        "columns={'<your column>': 'item_id', ...} (--columns YOURS=item_id,...)"
    )
    assert (
        "missing input columns: 'item_id' (int64 scalar), 'session_id' (int64 scalar)"
        in refused.stderr
    )

    mapped = run_cli(
        "infer",
        "reco",
        str(tmp_path / "rows.parquet"),
        "--url",
        urls["gRPC"],
        "--columns",
        "user_session=session_id,product_id=item_id",
        "-o",
        str(tmp_path / "answer.parquet"),
    )
    assert mapped.returncode == 0, mapped.stderr
    answer = pd.read_parquet(tmp_path / "answer.parquet")
    assert list(answer.columns[:1]) == ["user_session"]  # the session id comes back under your name
    expected = ensemble.transform(rows)
    np.testing.assert_array_equal(
        np.stack(answer["item_scores"]), np.stack(expected["item_scores"])
    )


def test_infer_head_prints_the_first_rows_and_how_many_there_are(served_repository, tmp_path):
    _, urls, _ = served_repository
    rows = toy_session.interactions(5, seed=35)
    rows.to_parquet(tmp_path / "rows.parquet")
    result = run_cli(
        "infer", "reco", str(tmp_path / "rows.parquet"), "--url", urls["gRPC"], "--head", "2"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [int(line.split()[0]) for line in lines[1:3]] == list(pd.unique(rows["session_id"]))[:2]
    assert lines[3:] == ["(2 of 5 rows; -o FILE writes them all)"]


def test_commands_and_the_import_print_no_third_party_warning(served_repository):
    _, urls, _ = served_repository
    assert run_cli("models", "--url", urls["gRPC"]).stderr == ""
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import merlin_torch_serving as m; m.Client, m.Ensemble, m.TransformWorkflow,"
                " m.TritonServer"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (imported.returncode, imported.stdout, imported.stderr) == (0, "", "")


class PeakMemory:
    """The most resident memory tritonserver and its stubs held together, sampled every 50 ms."""

    def __init__(self, server_pid: int):
        self.server = psutil.Process(server_pid)
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now_bytes(self) -> int:
        processes = [self.server, *self.server.children(recursive=True)]
        total = 0
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_info().rss
        return total

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()

    def _sample(self):
        while not self._stop.wait(0.05):
            self.peak_bytes = max(self.peak_bytes, self.now_bytes())


#: sessions x clicks of the big input; the served ensemble takes 100,000 clicks per request
SESSIONS, CLICKS_PER_SESSION, ROW_LIMIT = 200_000, 5, 100_000
#: server memory the whole input may add over what one request at the row limit already took.
#: Measured on this machine: the 1M clicks sent as one request add 276 MB (stub and server); in
#: requests of 100,000 clicks they add 39 MB. 150 MB is far below the first and leaves room for
#: the allocator's noise.
MEMORY_BOUND_BYTES = 150 * 2**20


def test_infer_sends_a_million_clicks_in_requests_of_whole_sessions_with_the_server_memory_bounded(
    served_repository, ensemble, tmp_path
):
    _, urls, output = served_repository
    rng = np.random.default_rng(7)
    rows = SESSIONS * CLICKS_PER_SESSION
    clicks = pd.DataFrame(
        {
            "session_id": rng.permutation(
                np.repeat(np.arange(SESSIONS, dtype=np.int64), CLICKS_PER_SESSION)
            ),
            "item_id": rng.integers(500, 540, rows),
            "category": rng.integers(0, 7, rows),
            "timestamp": rng.integers(0, 10**6, rows),
        }
    )
    clicks.to_parquet(tmp_path / "clicks.parquet")
    with Client(urls["gRPC"]) as client:
        client.infer("reco", clicks.iloc[:ROW_LIMIT])  # the memory of one full request, once
    with PeakMemory(int(re.search(r"ready \(pid (\d+)\)", output).group(1))) as memory:
        baseline = memory.now_bytes()
        result = run_cli(
            "infer",
            "reco",
            str(tmp_path / "clicks.parquet"),
            "--url",
            urls["gRPC"],
            "-o",
            str(tmp_path / "answer.parquet"),
            timeout_s=600,
        )

    assert result.returncode == 0, result.stderr
    progress = re.findall(r"^sent ([\d,]+) of 1,000,000 rows", result.stderr, flags=re.M)
    assert len(progress) == rows // ROW_LIMIT
    assert progress[-1] == "1,000,000"
    assert memory.peak_bytes - baseline < MEMORY_BOUND_BYTES, (memory.peak_bytes - baseline) / 2**20
    answer = pd.read_parquet(tmp_path / "answer.parquet")
    assert answer["session_id"].tolist() == list(pd.unique(clicks["session_id"]))
    # in-process, the same requests: a batch of other sessions may round scores differently
    request = frames.frame_to_table(clicks, ensemble.input_schema)
    expected = tables.concat(
        [ensemble.run(part) for part in chunks.split(request, ["session_id"], ROW_LIMIT)]
    )
    np.testing.assert_array_equal(np.stack(answer["item_ids"]), expected["item_ids"].values)
    np.testing.assert_array_equal(np.stack(answer["item_scores"]), expected["item_scores"].values)


def sigint_as_in_a_terminal() -> None:
    """SIGINT's default action in the child: a test runner started as a shell's background job
    ignores SIGINT, and so would the command it starts, until it sets a handler of its own."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_start_up_stops_at_once_without_a_traceback(served_repository, tmp_path):
    served = re.search(r"starting tritonserver on (\S+):", served_repository[2]).group(1)
    repository = shutil.copytree(served, tmp_path / "repository")  # its own, to find its server by
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "merlin_torch_serving",
            "serve",
            str(repository),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        read_until(process, "starting tritonserver on")
        deadline = time.monotonic() + 60
        while not servers_of(repository) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert servers_of(repository), "tritonserver did not start"
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        out, err = process.communicate(timeout=30)
        took_s = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
    assert (process.returncode, err.strip()) == (130, "interrupted"), err
    assert "ready" not in out
    assert took_s < 10, f"start-up took {took_s:.1f} s to stop"
    assert servers_of(repository) == []


def servers_of(repository) -> list[int]:
    """Pids of running tritonservers serving ``repository``."""
    flag = f"--model-repository={Path(repository).resolve()}"
    pids = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if (
            flag in (process.info["cmdline"] or [])
            and process.info["status"] != psutil.STATUS_ZOMBIE
        ):
            pids.append(process.pid)
    return pids


def test_serve_passes_the_arguments_after_a_double_dash_to_tritonserver(served_repository):
    _, urls, _ = served_repository
    with urllib.request.urlopen(f"http://{urls['HTTP']}/v2", timeout=10) as answer:
        assert json.load(answer)["name"] == SERVER_ID


def test_version_names_the_library_python_and_tritonserver_and_prints_no_warning():
    for args in (["--version"], ["serve", "--version"], ["models", "--version"]):
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        assert re.fullmatch(
            r"merlin-torch-serving \S+ \(Python 3\.11\.\d+; tritonserver 2\.\d+\.\d+ at \S+\)\n",
            result.stdout,
        )
        assert result.stderr == ""


def test_a_command_prints_no_tensorflow_warning(served_repository):
    _, urls, _ = served_repository
    result = run_cli("models", "--url", urls["gRPC"])
    assert result.returncode == 0
    assert "ensorflow" not in result.stderr


def test_arguments_after_a_double_dash_are_refused_by_commands_other_than_serve():
    result = run_cli("models", "--", "--id=x")
    assert result.returncode == 2
    assert "only `serve` passes arguments after '--'" in result.stderr


def test_ctrl_c_stops_the_server_cleanly(served_repository):
    process, _, output = served_repository
    server_pid = int(re.search(r"ready \(pid (\d+)\)", output).group(1))
    stubs = subprocess.run(
        ["pgrep", "-P", str(server_pid)], capture_output=True, text=True
    ).stdout.split()
    assert stubs, "the server should have python-backend stubs while serving"

    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=60)[0]

    assert process.returncode == 0, rest
    assert "stopped" in rest
    for pid in [server_pid, *map(int, stubs)]:
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} outlived the command"
