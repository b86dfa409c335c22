"""The Triton floor: an ensemble of no-op python-backend models, as many steps as the exported
ensemble has, taking the same request tensors. What it costs is what any python-backend ensemble
pays on this machine before doing any work.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format, text_format
from merlin.schema import Schema
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving import wire

FLOOR_MODEL = "floor"
# The step returns what it got, under other names: an ensemble output may not share an input's name.
_PASSED_SUFFIX = "__passed"
_NO_OP_MODEL_SOURCE = '''"""A python-backend model that answers every request with its inputs, untouched."""

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
                    pb_utils.Tensor(name + PASSED_SUFFIX, pb_utils.get_input_tensor_by_name(request, name).as_numpy())
                    for name in self.input_names
                ]
            )
            for request in requests
        ]
'''


def ensemble_step_count(repository: Path, ensemble_name: str) -> int:
    """How many models the ensemble ``ensemble_name`` of ``repository`` schedules per request."""
    config_text = (repository / ensemble_name / "config.pbtxt").read_text()
    config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    if config.platform != "ensemble":
        raise ValueError(f"model {ensemble_name!r} in {str(repository)!r} is not an ensemble (platform {config.platform!r})")
    return len(config.ensemble_scheduling.step)


def write_floor_repository(repository: Path, steps: int, request_schema: Schema) -> list[str]:
    """Write ``steps`` chained no-op models and the ensemble ``floor`` over them; return the
    ensemble's output tensor names. Tensors are those of ``request_schema`` in the wire format."""
    if steps < 1:
        raise ValueError(f"the floor needs at least one step, got {steps!r}")
    specs = wire.schema_specs(request_schema)
    tensors = [{"name": spec.name, "data_type": "TYPE_" + spec.triton_dtype, "dims": list(spec.dims)} for spec in specs]
    passed = [{**tensor, "name": tensor["name"] + _PASSED_SUFFIX} for tensor in tensors]
    ensemble_steps = []
    source = {spec.name: spec.name for spec in specs}  # step input -> ensemble tensor it reads
    for index in range(steps):
        name = f"{FLOOR_MODEL}-{index}-noop"
        _write_model(repository / name, {
            "name": name,
            "backend": "python",
            "max_batch_size": 0,
            "input": tensors,
            "output": passed,
            "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        })
        (repository / name / "1" / "model.py").write_text(_NO_OP_MODEL_SOURCE.format(suffix=_PASSED_SUFFIX))
        last = index == steps - 1
        produced = {
            spec.name + _PASSED_SUFFIX: spec.name + _PASSED_SUFFIX if last else f"{name}/{spec.name}" for spec in specs
        }
        ensemble_steps.append({"model_name": name, "model_version": -1, "input_map": dict(source), "output_map": produced})
        source = {spec.name: produced[spec.name + _PASSED_SUFFIX] for spec in specs}
    _write_model(repository / FLOOR_MODEL, {
        "name": FLOOR_MODEL,
        "platform": "ensemble",
        "max_batch_size": 0,
        "input": tensors,
        "output": passed,
        "ensemble_scheduling": {"step": ensemble_steps},
    })
    return [tensor["name"] for tensor in passed]


def _write_model(model_dir: Path, config: dict) -> None:
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(parsed))
