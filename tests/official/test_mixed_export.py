"""The official examples exported with the model on libtorch (``backend="pytorch"``) after the
python workflow step: two step models, the TopK, decoding and blanking of filtered sessions compiled
into the libtorch one, so a request crosses one python stub. The repository, run step by step as
tritonserver runs it (tests/repository_runner.py, no server needed; test_served.py serves it),
answers exactly what the ensemble answers in-process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from merlin_torch_serving.data import frames, wire
from tests.official.example import request_rows
from tests.repository_runner import response_arrays, run_repository


@pytest.fixture(scope="session")  # not rebuilt when the session-wide `example` switches
def exported(tmp_path_factory, getting_started_example, end_to_end_example):
    """Per example: the ensemble, its repository and its export result."""
    exported = {}
    for example in (getting_started_example, end_to_end_example):
        repository = tmp_path_factory.mktemp(f"mixed_{example.name}")
        ensemble = example.ensemble(backend="pytorch")
        exported[example.name] = (ensemble, repository, ensemble.export(repository, "reco"))
    return exported


def test_mixed_export_is_one_python_step_and_one_libtorch_step(exported, example):
    _, repository, _ = exported[example.name]
    steps = json.loads((repository / "reco" / "1" / "manifest.json").read_text())["steps"]
    assert [step["backend"] for step in steps] == ["python", "pytorch"]
    assert steps[0]["fused_operators"] == ["TransformWorkflow"]
    assert steps[1]["fused_operators"][-1] == "BlankFilteredRows"
    assert "filtered_out" in steps[1]["inputs"]  # the mark reaches libtorch as a bool tensor


@pytest.mark.parametrize("n_sessions", [1, 7, 32])
def test_mixed_export_answers_like_the_ensemble_in_process_exactly(exported, example, n_sessions):
    ensemble, repository, _ = exported[example.name]
    rows = request_rows(example, n_sessions, seed=200 + n_sessions)
    request = frames.frame_to_table(rows, ensemble.input_schema)
    names = ensemble.input_schema.column_names

    expected = response_arrays(ensemble.run(request), names)

    served = run_repository(repository, "reco", wire.to_wire(request))

    assert sorted(served) == sorted(expected)
    for name, array in expected.items():
        assert served[name].dtype == array.dtype, name
        np.testing.assert_array_equal(served[name], array, err_msg=name)
    assert served["filtered_out"].sum() == 1


def test_warm_up_requests_pass_the_examples_filters(exported, example):
    _, repository, result = exported[example.name]
    manifest = json.loads((repository / "reco" / "1" / "manifest.json").read_text())
    assert manifest["warmup"] == {"passes_filters": True, "problem": None}
    assert result.warnings == []
