"""The official examples with their libtorch steps compiled ahead of time (``compiled="package"``):
getting-started's all-libtorch export (workflow, model, top k, decoding and blanking) is one
AOTInductor package, served from a tritonserver whose backend folder holds the pytorch backend
alone; end-to-end keeps its custom ``ItemRecency`` and ``LogOp`` in a python step and compiles the
rest of its workflow with the model into one package. Neither holds any TorchScript.

Served answers equal in-process answers bit for bit over gRPC and HTTP for 1, 7 and 64 sessions,
filtered sessions included; in-process answers are within the packages' tolerance of the
TorchScript export's, which equal the eager model's exactly (``test_scripted``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import Client
from merlin_torch_serving.aot.tolerance import SCORE_TOLERANCE
from tests.official.example import request_rows
from tests.served import assert_frames_equal
from tests.session_models import SERVED_TORCH_THREADS, torch_threads

SESSION_COUNTS = (1, 7, 64)


@pytest.fixture(scope="session")  # not rebuilt when the session-wide `example` switches
def compiled(getting_started_example, end_to_end_example, pytorch_only_server, triton_server):
    """Per example: (compiled ensemble, its TorchScript twin, server, model name, export)."""
    made = {}
    for example, server in (
        (getting_started_example, pytorch_only_server),
        (end_to_end_example, triton_server),
    ):
        ensemble = example.ensemble("pytorch", "pytorch", compiled="package")
        model = f"official-compiled-{example.name}"
        result = ensemble.export(server.repository, model)
        server.load(model)
        twin = example.ensemble("pytorch", "pytorch", compiled="torchscript")
        made[example.name] = (ensemble, twin, server, model, result)
    return made


def _steps(server, model: str) -> list[tuple[str, str | None]]:
    manifest = json.loads((Path(server.repository) / model / "1" / "manifest.json").read_text())
    return [(step["backend"], step.get("compiled")) for step in manifest["steps"]]


@pytest.mark.integration
def test_getting_started_is_one_package_and_end_to_end_a_python_head_and_a_package(compiled):
    for name, expected in (
        ("getting_started", [("pytorch", "package")]),
        ("end_to_end", [("python", None), ("pytorch", "package")]),
    ):
        _, _, server, model, result = compiled[name]
        assert _steps(server, model) == expected, name
        assert not list(Path(server.repository).glob(f"{model}-*/1/model.pt"))
        assert not [w for w in result.warnings if "stays TorchScript" in w], result.warnings


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_served_answer_equals_in_process_exactly(example, compiled, protocol, n_sessions):
    ensemble, _, server, model, _ = compiled[example.name]
    rows = request_rows(example, n_sessions, seed=600 + n_sessions)
    url = server.grpc_url if protocol == "grpc" else server.http_url

    answer = Client(url, protocol=protocol).infer(model, rows)

    with torch_threads(SERVED_TORCH_THREADS):
        assert_frames_equal(answer, ensemble.transform(rows))
    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))
    assert answer["filtered_out"].sum() == 1  # the one-click session, answered and marked


@pytest.mark.parametrize("n_sessions", SESSION_COUNTS)
def test_in_process_answers_are_within_the_tolerance_of_the_torchscript_export(
    example, compiled, n_sessions
):
    ensemble, twin, _, _, _ = compiled[example.name]
    rows = request_rows(example, n_sessions, seed=700 + n_sessions)
    with torch_threads(SERVED_TORCH_THREADS):
        answer, reference = ensemble.transform(rows), twin.transform(rows)

    assert answer["session_id"].tolist() == reference["session_id"].tolist()
    assert answer["filtered_out"].tolist() == reference["filtered_out"].tolist()
    scores = example.scores_column
    np.testing.assert_allclose(
        np.stack(answer[scores]), np.stack(reference[scores]), rtol=0, atol=SCORE_TOLERANCE
    )
    ids = "item_ids" if "item_ids" in reference else "item_id_scores_ids"
    if ids in reference:
        differ = np.stack(answer[ids]) != np.stack(reference[ids])
        near = np.abs(np.diff(np.stack(reference[scores]), axis=1)) <= SCORE_TOLERANCE
        tied = np.zeros_like(differ)
        tied[:, 1:] |= near
        tied[:, :-1] |= near
        tied[:, -1] = True
        assert not (differ & ~tied).any(), "ids differ where no near tie explains it"
