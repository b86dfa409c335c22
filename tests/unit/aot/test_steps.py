"""What a libtorch step becomes: a package where torch.export takes its operators, else TorchScript,
the reason logged, recorded in the manifest and among the export's warnings; ``compiled`` asks
for either explicitly, and ``$MTS_COMPILED`` (which the suite sets to "torchscript") when it is
left out. No package is compiled here: every model below is one torch.export refuses (a branch on
its data) or is not asked to take."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from merlin_torch_serving import Ensemble, PredictPytorch
from merlin_torch_serving.exceptions import ExportError, ModelPreparationError, PackageError
from tests import any_models

STEP = "positional-0-predictpytorch"


def _ensemble(compiled: str = "auto") -> Ensemble:
    op = PredictPytorch(
        any_models.PositionalScorer(),
        any_models.POSITIONAL_INPUTS,
        any_models.POSITIONAL_OUTPUTS,
        backend="pytorch",
        compiled=compiled,
    )
    return Ensemble(op, any_models.POSITIONAL_INPUTS)


def _manifest_step(repository) -> dict:
    manifest = json.loads((repository / "positional" / "1" / "manifest.json").read_text())
    (step,) = manifest["steps"]
    return step


def test_a_model_torch_export_refuses_stays_torchscript_saying_why(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="merlin_torch_serving"):
        result = _ensemble().export(tmp_path, "positional")

    step = _manifest_step(tmp_path)
    assert step["compiled"] == "torchscript"
    assert "torch.export cannot take it" in step["compiled_note"]
    assert (tmp_path / STEP / "1" / "model.pt").is_file()
    assert not (tmp_path / STEP / "1" / "model.pt2").exists()
    [warning] = result.warnings
    assert warning.startswith(f"libtorch step {STEP!r} stays TorchScript: TorchScript, as no")
    assert "PredictPytorch[pytorch] stays TorchScript: " in caplog.text


def test_compiled_torchscript_keeps_torchscript_without_trying_a_package(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="merlin_torch_serving"):
        result = _ensemble(compiled="torchscript").export(tmp_path, "positional")

    step = _manifest_step(tmp_path)
    assert step["compiled"] == "torchscript"
    assert step["compiled_note"].startswith("TorchScript: PredictPytorch[pytorch] asked for")
    assert result.warnings == []
    assert "stays TorchScript" not in caplog.text


def test_compiled_package_fails_the_export_where_no_package_can_be_made(tmp_path):
    with pytest.raises(
        ExportError,
        match=rf"libtorch step '{STEP}': PredictPytorch\[pytorch\]: torch.export cannot take it",
    ):
        _ensemble(compiled="package").export(tmp_path, "positional")
    assert not (tmp_path / STEP).exists()


def test_compiled_package_fails_an_in_process_run_where_no_package_can_be_made():
    from tests.unit.ops.test_pytorch_any_model import positional_request

    with pytest.raises(PackageError, match=r"PredictPytorch\[pytorch\]: torch.export cannot take"):
        _ensemble(compiled="package").run(positional_request())


def test_a_package_on_the_python_backend_is_refused():
    with pytest.raises(ValueError, match="compiled='package' makes a libtorch step"):
        PredictPytorch(
            any_models.PositionalScorer(),
            any_models.POSITIONAL_INPUTS,
            any_models.POSITIONAL_OUTPUTS,
            backend="python",
            compiled="package",
        )


def test_libtorch_for_a_model_neither_torchscript_nor_torch_export_takes_is_refused_at_once():
    from merlin.schema import ColumnSchema, Schema

    with pytest.raises(
        ModelPreparationError,
        match=r"model 'SignedRowSum': cannot become TorchScript .* nor can it be a package:"
        r" SignedRowSum: torch.export cannot take it",
    ):
        PredictPytorch(
            any_models.SignedRowSum(),
            any_models.SIGNED_INPUTS,
            Schema([ColumnSchema("total")]),
            backend="pytorch",
            compiled="auto",
        )


def test_the_in_process_run_of_a_step_that_stays_torchscript_is_its_torchscript():
    from tests.unit.ops.test_pytorch_any_model import eager_positional_answer, positional_request

    result = _ensemble().run(positional_request())
    expected_score, _ = eager_positional_answer()
    assert torch.equal(torch.from_numpy(result["score"].values), torch.from_numpy(expected_score))


def test_left_out_compiled_is_the_process_default_from_the_environment(monkeypatch):
    monkeypatch.setenv("MTS_COMPILED", "package")
    op = PredictPytorch(
        any_models.PositionalScorer(), any_models.POSITIONAL_INPUTS, any_models.POSITIONAL_OUTPUTS
    )
    assert op.compiled == "package"
    assert op.backend == "pytorch"
    monkeypatch.setenv("MTS_COMPILED", "sometimes")
    with pytest.raises(ValueError, match=r"\$MTS_COMPILED must be one of 'auto', 'package'"):
        PredictPytorch(
            any_models.PositionalScorer(),
            any_models.POSITIONAL_INPUTS,
            any_models.POSITIONAL_OUTPUTS,
        )
