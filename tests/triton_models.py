"""Write tiny python-backend models into a Triton model repository, for tests that need a served
model.

Each model is a config.pbtxt written through Triton's protobuf and a model.py around one compute
function.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

#: a tensor as (Triton data type such as "TYPE_INT64", dims such as [-1])
TensorSpec = tuple[str, Sequence[int]]

_MODEL_PY = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils

INPUT_NAMES = {input_names!r}
OUTPUT_NAMES = {output_names!r}


def compute(inputs):
{compute}


class TritonPythonModel:
    def initialize(self, args):
{initialize}

    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = {{
                name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                for name in INPUT_NAMES
            }}
            outputs = compute(inputs)
            tensors = [pb_utils.Tensor(name, np.asarray(outputs[name])) for name in OUTPUT_NAMES]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
"""


def write_python_model(
    repository: str | Path,
    name: str,
    *,
    inputs: Mapping[str, TensorSpec],
    outputs: Mapping[str, TensorSpec],
    compute: str,
    initialize: str = "",
    versions: Sequence[int] = (1,),
    max_batch_size: int = 0,
) -> Path:
    """Write model ``name`` and return its folder.

    ``compute`` is the body of ``compute(inputs)``: it gets a dict of numpy arrays keyed by input
    name and returns one keyed by output name. ``initialize`` runs once when the model loads
    (``time`` and ``np`` are imported), e.g. to make loading slow or fail on purpose.
    """
    folder = Path(repository) / name
    config = json_format.ParseDict(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": [
                {"name": key, "data_type": dtype, "dims": list(dims)}
                for key, (dtype, dims) in inputs.items()
            ],
            "output": [
                {"name": key, "data_type": dtype, "dims": list(dims)}
                for key, (dtype, dims) in outputs.items()
            ],
        },
        model_config_pb2.ModelConfig(),
    )
    source = _MODEL_PY.format(
        input_names=list(inputs),
        output_names=list(outputs),
        compute=textwrap.indent(textwrap.dedent(compute).strip(), " " * 4),
        initialize=textwrap.indent(textwrap.dedent(initialize).strip() or "pass", " " * 8),
    )
    for version in versions:
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        (folder / str(version) / "model.py").write_text(source)
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
    return folder


INT64_VECTOR = ("TYPE_INT64", [-1])


def write_doubler(repository: str | Path, name: str, **options) -> Path:
    """A python model that answers ``y = 2 * x`` (int64 vectors).

    ``options`` are as for write_python_model.
    """
    return write_python_model(
        repository,
        name,
        inputs={"x": INT64_VECTOR},
        outputs={"y": INT64_VECTOR},
        compute="return {'y': inputs['x'] * 2}",
        **options,
    )


def write_invalid_config(repository: Path, name: str) -> None:
    """A model whose config.pbtxt names a field ModelConfig has not, on its second line."""
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text('backend: "python"\nno_such_field: 1\n')


def write_onnx_model(repository: Path, name: str) -> None:
    """A model for Triton's ONNX Runtime backend, which the bundled server lacks; the file's content
    never matters since no backend reads it."""
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.onnx").write_bytes(b"not read by any backend here")
    (repository / name / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [{ name: "x" data_type: TYPE_INT64 dims: [-1] }]\n'
        'output [{ name: "y" data_type: TYPE_INT64 dims: [-1] }]\n'
    )
