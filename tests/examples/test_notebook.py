"""Runs notebooks/session_based_recommendations.ipynb top to bottom, small, on a real tritonserver.

The kernel is ipykernel on this interpreter (``sys.executable``), whatever kernelspecs are
installed, with the checkout on its path as the project's kernel has it (see ``./run notebook``).
The committed notebook carries the outputs of this run: ``MTS_NOTEBOOK_UPDATE=1`` makes the run
write them back into it, and a test checks that the committed outputs come from the code that is
committed.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.notebooks import ANSI_ESCAPE, kernel_on_this_python

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "session_based_recommendations.ipynb"
CELL_TIMEOUT_S = 600


def outputs_text(cell) -> str:
    """Everything a code cell printed or displayed as text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


@pytest.fixture(scope="module")
def executed_notebook(tmp_path_factory, pytorch_backend):
    """The notebook after a small run: 600 sessions, 1 epoch, output in a tmp folder, serving the
    mixed repository (Triton's pytorch backend is built for this torch).

    Runs in the notebooks folder, as Jupyter would; a cell that raises (a tritonserver that
    cannot start included) fails the tests and keeps the executed copy for reading.
    """
    output = tmp_path_factory.mktemp("notebook_output")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    checkout_before = sorted(NOTEBOOK.parent.iterdir())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", str(ROOT))  # as the project's kernel has it
        env.setenv("MTS_NOTEBOOK_SESSIONS", "600")
        env.setenv("MTS_NOTEBOOK_EPOCHS", "1")
        env.setenv("MTS_NOTEBOOK_OUTPUT", str(output / "run"))
        env.delenv("MTS_NOTEBOOK_INTERACTIONS", raising=False)
        env.delenv("MTS_NOTEBOOK_BACKEND", raising=False)
        client = NotebookClient(
            notebook,
            km=kernel_on_this_python(),
            timeout=CELL_TIMEOUT_S,
            resources={"metadata": {"path": str(NOTEBOOK.parent)}},
        )
        failure = None
        try:
            # The client shuts down a kernel it was handed only when told to.
            client.execute(cleanup_kc=True)
        except CellExecutionError as error:
            failure = ANSI_ESCAPE.sub("", str(error))
    executed = output / NOTEBOOK.name
    nbformat.write(notebook, executed)
    if failure is not None:
        pytest.fail(
            f"{NOTEBOOK.name} failed; the executed copy is {executed}\n{failure}", pytrace=False
        )
    assert sorted(NOTEBOOK.parent.iterdir()) == checkout_before, (
        "the notebook wrote into the checkout"
    )
    if os.environ.get("MTS_NOTEBOOK_UPDATE") == "1":
        nbformat.write(notebook, NOTEBOOK)
    return notebook, output / "run"


def code_cell(notebook, cell_id: str):
    return next(cell for cell in notebook.cells if cell.get("id") == cell_id)


def test_committed_notebook_has_a_parameters_cell_and_the_python3_kernel():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert "parameters" in code_cells[0].metadata.get("tags", [])


def test_committed_outputs_are_the_suites_run_of_the_committed_code(executed_notebook):
    """Rendered without running (on GitHub, say), the notebook shows what this test run printed
    for the code it shows; refresh them with MTS_NOTEBOOK_UPDATE=1 after changing a cell."""
    committed = nbformat.read(NOTEBOOK, as_version=4)
    executed, _ = executed_notebook
    code_cells = [cell for cell in committed.cells if cell.cell_type == "code"]
    assert [cell.source for cell in code_cells] == [
        cell.source for cell in executed.cells if cell.cell_type == "code"
    ], (
        "a code cell changed since the committed outputs were made; run this test with"
        " MTS_NOTEBOOK_UPDATE=1"
    )
    assert [cell.execution_count for cell in code_cells] == list(range(1, len(code_cells) + 1))
    assert all(cell.outputs for cell in code_cells if cell.id != "parameters")
    assert not [o for cell in code_cells for o in cell.outputs if o.output_type == "error"]


def test_the_notebook_shows_the_operator_chain_and_needs_no_path_workaround():
    code = "\n".join(
        cell.source
        for cell in nbformat.read(NOTEBOOK, as_version=4).cells
        if cell.cell_type == "code"
    )
    assert "sys.path" not in code
    assert "from examples.session_based.demo" not in code
    for operator in (
        "TransformWorkflow(workflow)",
        "PredictPytorch(session_model",
        "TopK(",
        "DecodeItemIds(workflow",
    ):
        assert operator in code


def test_the_notebook_writes_into_a_new_temporary_folder_by_default(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.delenv("MTS_NOTEBOOK_OUTPUT", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parameters = next(
        cell
        for cell in nbformat.read(NOTEBOOK, as_version=4).cells
        if cell.get("id") == "parameters"
    )
    namespace = {}
    exec(parameters.source, namespace)
    assert Path(namespace["OUTPUT_DIR"]).parent == tmp_path


def test_notebook_runs_every_code_cell_in_order(executed_notebook):
    notebook, _ = executed_notebook
    counts = [cell.execution_count for cell in notebook.cells if cell.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))
    errors = [
        cell.id
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.output_type == "error"
    ]
    assert errors == []
    warned = [
        cell.id
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.output_type == "stream" and "Warning" in output.text
    ]
    assert warned == [], "third-party warnings in the notebook's outputs"


def test_notebook_writes_the_workflow_and_the_repository_into_the_output_dir(executed_notebook):
    notebook, output = executed_notebook
    assert (output / "workflow" / "workflow.pkl").is_file()
    assert (output / "repository" / "session_recs" / "config.pbtxt").is_file()
    listing = outputs_text(code_cell(notebook, "export"))
    assert "; the mixed repository: TransformWorkflow on the python backend" in listing
    assert "session_recs/    config.pbtxt: name 'session_recs', platform 'ensemble'" in listing
    assert (
        "session_recs-0-transformworkflow/    config.pbtxt: name"
        " 'session_recs-0-transformworkflow', backend 'python'" in listing
    )
    assert (
        "session_recs-1-predictpytorch_topk_decodeitemids/    config.pbtxt: name "
        "'session_recs-1-predictpytorch_topk_decodeitemids', backend 'pytorch'" in listing
    )


def test_notebook_serves_the_in_process_recommendations_and_stops_the_server(executed_notebook):
    notebook, _ = executed_notebook
    served = outputs_text(code_cell(notebook, "serve"))
    assert "item_ids" in served
    assert "item_scores" in served
    assert "from the mixed repository" in served
    assert "tritonserver stopped: True" in served
    pid = int(re.search(r"tritonserver \(pid (\d+)\)", served).group(1))
    cmdline = Path(f"/proc/{pid}/cmdline")
    assert not (cmdline.exists() and b"tritonserver" in cmdline.read_bytes())

    check = outputs_text(code_cell(notebook, "check"))
    shown = re.search(
        r"served == in-process: same top-10 item ids and scores for sessions \[([\d, ]+)\]", check
    )
    assert shown is not None, check
    sessions = [int(session) for session in shown.group(1).split(", ")]
    assert len(sessions) == 3
    for session in sessions:
        assert re.search(
            rf"session {session}: last clicks .*\n  recommended: \[(\d+, ){{9}}\d+\]", check
        )


def test_run_notebook_opens_it_in_jupyterlab_with_the_projects_kernel(tmp_path):
    """`./run notebook` (from any folder) serves the notebook, and the kernel it names is this
    virtualenv's Python with the checkout on its path."""
    import json
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # JupyterLab logs to stderr: a file, since a pipe nobody reads would fill and stall it
    log = tmp_path / "notebook.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [
                str(ROOT / "run"),
                "notebook",
                "--no-browser",
                f"--port={port}",
                "--IdentityProvider.token=t",
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            start_new_session=True,
        )

    def get(path):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?token=t", timeout=10) as answer:
            return json.load(answer)

    try:
        deadline, specs = time.monotonic() + 600, None  # the first call installs JupyterLab
        while specs is None and process.poll() is None and time.monotonic() < deadline:
            try:
                specs = get("/api/kernelspecs")
            except OSError:
                time.sleep(0.5)
        assert specs is not None, log.read_text() if process.poll() is not None else "no answer"
        notebook = get("/api/contents/notebooks/session_based_recommendations.ipynb")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(60)
    kernel = notebook["content"]["metadata"]["kernelspec"]["name"]
    spec = specs["kernelspecs"][kernel]["spec"]
    assert Path(spec["argv"][0]) == Path(sys.executable)
    assert spec["env"] == {"PYTHONPATH": str(ROOT)}
