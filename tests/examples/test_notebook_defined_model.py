"""A model defined in a notebook cell serves: a notebook (executed here by a real kernel) defines a
``torch.nn.Module`` that TorchScript cannot compile, with a helper function of the same cell,
exports it behind a workflow, serves it on a real tritonserver it starts itself and writes both
answers down; the test compares them bit for bit.

The class lives in the kernel's ``__main__``, which no other process can import: the export saves
it by value. The kernel runs in a folder of its own, so the server cannot import anything of the
checkout either.
"""

from __future__ import annotations

import json

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.examples.test_notebook import ROOT
from tests.notebooks import ANSI_ESCAPE, kernel_on_this_python

pytestmark = pytest.mark.integration

CELLS = {
    "imports": """
import os
from pathlib import Path

import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema

from merlin_torch_serving import (
    Client, Ensemble, PredictPytorch, TopK, TransformWorkflow, TritonServer,
)
from tests import toy_session

OUTPUT = Path(os.environ["MTS_TEST_OUTPUT"])
""",
    "data": """
clicks = toy_session.interactions(n_sessions=40)
workflow = toy_session.fitted_workflow(OUTPUT / "vocabularies", clicks)
catalog = int(workflow.output_schema["item_id-list"].properties["domain"]["max"]) + 1
""",
    "model": """
def last_clicks(items, keep=3):
    # a session's most recent items, padding left out
    return [row[row != 0][-keep:] for row in items]


class RecentItemsScorer(torch.nn.Module):
    # scores the catalog against the mean of each session's last clicks: a loop over rows of
    # different lengths, which TorchScript cannot compile and a trace would bake in

    def __init__(self, catalog, dim=8):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.items = torch.nn.Parameter(torch.randn(catalog, dim, generator=generator))

    def forward(self, inputs):
        sessions = [
            self.items[row].mean(0) if len(row) else torch.zeros(self.items.shape[1])
            for row in last_clicks(inputs["item_id-list"])
        ]
        return torch.stack(sessions) @ self.items.T
""",
    "graph": """
features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
scores = features >> PredictPytorch(
    RecentItemsScorer(catalog),
    workflow.output_schema.select_by_name(["item_id-list"]),
    Schema([ColumnSchema("scores", dtype="float32", dims=(None, catalog))]),
)
top = scores >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
ensemble = Ensemble(features["session_id"] + top, workflow.input_schema)
request = clicks[clicks["session_id"] < 1010]
in_process = ensemble.transform(request)
""",
    "serve": """
exported = ensemble.export(OUTPUT / "repository", "notebook_model")
with TritonServer(exported.path) as server:
    served = Client(server.grpc_url).infer("notebook_model", request)
np.savez(
    OUTPUT / "answers.npz",
    **{f"served_{name}": np.stack(served[name]) for name in served.columns},
    **{f"in_process_{name}": np.stack(in_process[name]) for name in in_process.columns},
)
print("served", len(served), "sessions")
""",
}


@pytest.fixture(scope="module")
def notebook_run(tmp_path_factory):
    """The notebook's output folder after a run in a folder of its own."""
    output = tmp_path_factory.mktemp("notebook_defined_model")
    work = tmp_path_factory.mktemp("kernel_folder")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(source.strip(), id=name) for name, source in CELLS.items()
    ]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", str(ROOT))  # as the project's kernel has it
        env.setenv("MTS_TEST_OUTPUT", str(output))
        client = NotebookClient(
            notebook,
            km=kernel_on_this_python(),
            timeout=600,
            resources={"metadata": {"path": str(work)}},
        )
        try:
            client.execute(cleanup_kc=True)
        except CellExecutionError as error:
            pytest.fail(f"the notebook failed:\n{ANSI_ESCAPE.sub('', str(error))}", pytrace=False)
    return output


def test_a_model_class_of_a_notebook_cell_serves_the_answers_it_gives_in_process(notebook_run):
    answers = np.load(notebook_run / "answers.npz")
    for name in ("session_id", "item_ids", "item_scores"):
        served, in_process = answers[f"served_{name}"], answers[f"in_process_{name}"]
        assert served.dtype == in_process.dtype, name
        np.testing.assert_array_equal(served, in_process, err_msg=name)
    assert len(answers["served_session_id"]) == 10


def test_the_notebook_model_runs_eagerly_on_the_python_backend_saved_by_value(notebook_run):
    repository = notebook_run / "repository"
    manifest = json.loads((repository / "notebook_model" / "1" / "manifest.json").read_text())
    (predict,) = [
        operator
        for step in manifest["steps"]
        for operator in step["operators"]
        if operator["parameters"].get("execution") is not None
    ]
    assert predict["parameters"]["execution"] == "eager"
    assert predict["parameters"]["backend"] == "python"
    (saved,) = repository.glob("*/1/ops/*/eager_model.pt")
    assert b"RecentItemsScorer" in saved.read_bytes()
    assert b"last_clicks" in saved.read_bytes(), "the cell's helper is saved with the class"
