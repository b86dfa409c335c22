"""The floor of a route's hop: a no-op python step that hands its input to a no-op libtorch model,
through the ensemble scheduler (as an unrouted mixed export does) or through business logic
scripting from inside the step (as a route does). What the second costs more is what any BLS call
costs on this machine before a route does any work."""

from __future__ import annotations

from pathlib import Path

import torch
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.export.config import to_pbtxt

#: the two ensembles, each answering X + 1 for an int64 vector X
THROUGH_ENSEMBLE, THROUGH_BLS = "floor-ensemble-hop", "floor-bls-hop"
_TENSOR = {"data_type": "TYPE_INT64", "dims": [-1]}
_STEP_SOURCE = '''"""A python step that passes X on: as its output, or to {target!r} through BLS."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if not {bls!r}:
                answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
                continue
            called = pb_utils.InferenceRequest(
                model_name={target!r},
                requested_output_names=["Y"],
                inputs=[pb_utils.Tensor("X", x)],
            ).exec()
            y = pb_utils.get_output_tensor_by_name(called, "Y").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return answers
'''


class _PlusOne(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["X"] + 1


def write_bls_floor(repository: Path) -> list[str]:
    """Write the no-op models and both ensembles into ``repository``; return the ensembles."""
    leaf = "floor-libtorch-plus-one"
    _model(
        repository,
        leaf,
        {"backend": "pytorch", "parameters": {"INTRA_OP_THREAD_COUNT": {"string_value": "1"}}},
    )
    torch.jit.save(torch.jit.script(_PlusOne()), str(repository / leaf / "1" / "model.pt"))
    for name, bls in (("floor-python-pass", False), ("floor-python-bls", True)):
        _model(repository, name, {"backend": "python"})
        source = _STEP_SOURCE.format(target=leaf, bls=bls)
        (repository / name / "1" / "model.py").write_text(source)
    _ensemble(repository, THROUGH_ENSEMBLE, ["floor-python-pass", leaf])
    _ensemble(repository, THROUGH_BLS, ["floor-python-bls"])
    return [THROUGH_ENSEMBLE, THROUGH_BLS]


def _model(repository: Path, name: str, settings: dict) -> None:
    (repository / name / "1").mkdir(parents=True)
    config = {
        "name": name,
        "max_batch_size": 0,
        "input": [{"name": "X", **_TENSOR}],
        "output": [{"name": "Y", **_TENSOR}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        **settings,
    }
    _write_config(repository / name, config)


def _ensemble(repository: Path, name: str, models: list[str]) -> None:
    (repository / name / "1").mkdir(parents=True)
    steps = []
    for position, model in enumerate(models):
        source = "X" if position == 0 else f"y{position - 1}"
        target = "Y" if position == len(models) - 1 else f"y{position}"
        steps.append(
            {
                "model_name": model,
                "model_version": -1,
                "input_map": {"X": source},
                "output_map": {"Y": target},
            }
        )
    config = {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": 0,
        "input": [{"name": "X", **_TENSOR}],
        "output": [{"name": "Y", **_TENSOR}],
        "ensemble_scheduling": {"step": steps},
    }
    _write_config(repository / name, config)


def _write_config(folder: Path, config: dict) -> None:
    parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    (folder / "config.pbtxt").write_text(to_pbtxt(parsed))
