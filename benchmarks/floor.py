"""The Triton floor: an ensemble of no-op python-backend models, as many steps as the exported
ensemble has, taking the same request tensors. What it costs is what any python-backend ensemble
pays on this machine before doing any work.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format
from merlin.schema import Schema
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.export.config import from_pbtxt, tensor_configs, to_pbtxt

FLOOR_MODEL = "floor"
# The step returns what it got, under other names: an ensemble output may not share an input's name.
_PASSED_SUFFIX = "__passed"
_NO_OP_MODEL_SOURCE = '''"""A python-backend model that answers every request with its inputs."""

import json

import triton_python_backend_utils as pb_utils

PASSED_SUFFIX = "{suffix}"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(
                        name + PASSED_SUFFIX,
                        pb_utils.get_input_tensor_by_name(request, name).as_numpy(),
                    )
                    for name in self.input_names
                ]
            )
            for request in requests
        ]
'''


def ensemble_step_count(repository: Path, ensemble_name: str) -> int:
    """How many models the ensemble ``ensemble_name`` of ``repository`` schedules per request."""
    config = from_pbtxt((repository / ensemble_name / "config.pbtxt").read_text())
    if config.platform != "ensemble":
        raise ValueError(
            f"model {ensemble_name!r} in {str(repository)!r} is not an ensemble (platform"
            f" {config.platform!r})"
        )
    return len(config.ensemble_scheduling.step)


def write_floor_repository(repository: Path, steps: int, request_schema: Schema) -> list[str]:
    """Write ``steps`` chained no-op models and the ensemble ``floor`` over them; return the
    ensemble's output tensor names. Tensors are those of ``request_schema`` in the wire format."""
    if steps < 1:
        raise ValueError(f"the floor needs at least one step, got {steps!r}")
    tensors = tensor_configs(request_schema)
    names = [tensor["name"] for tensor in tensors]
    passed = [{**tensor, "name": tensor["name"] + _PASSED_SUFFIX} for tensor in tensors]
    ensemble_steps = []
    source = {name: name for name in names}  # step input -> ensemble tensor it reads
    for index in range(steps):
        name = f"{FLOOR_MODEL}-{index}-noop"
        _write_model(
            repository / name,
            {
                "name": name,
                "backend": "python",
                "max_batch_size": 0,
                "input": tensors,
                "output": passed,
                "instance_group": [{"kind": "KIND_CPU", "count": 1}],
            },
        )
        (repository / name / "1" / "model.py").write_text(
            _NO_OP_MODEL_SOURCE.format(suffix=_PASSED_SUFFIX)
        )
        last = index == steps - 1
        produced = {
            tensor + _PASSED_SUFFIX: tensor + _PASSED_SUFFIX if last else f"{name}/{tensor}"
            for tensor in names
        }
        ensemble_steps.append(
            {
                "model_name": name,
                "model_version": -1,
                "input_map": dict(source),
                "output_map": produced,
            }
        )
        source = {tensor: produced[tensor + _PASSED_SUFFIX] for tensor in names}
    _write_model(
        repository / FLOOR_MODEL,
        {
            "name": FLOOR_MODEL,
            "platform": "ensemble",
            "max_batch_size": 0,
            "input": tensors,
            "output": passed,
            "ensemble_scheduling": {"step": ensemble_steps},
        },
    )
    return [tensor["name"] for tensor in passed]


def _write_model(model_dir: Path, config: dict) -> None:
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        to_pbtxt(json_format.ParseDict(config, model_config_pb2.ModelConfig()))
    )
