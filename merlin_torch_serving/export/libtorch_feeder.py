"""A small libtorch model that lets a libtorch step reading the request batch across requests, in
an export with no python step (raw clicks in, the workflow, the model and its ranking compiled into
one libtorch step).

Triton cuts a batched libtorch step's answer back per request by the shape of an input
(``libtorch_batching``), and a request's answer has a row per session, which only counting the
request's distinct session ids tells. A python step that feeds a batched libtorch step counts
them; here this model does, one request at a time, before the step: it answers ``ROWS_TENSOR``
(one byte per session) and every tensor the step reads, flat and one element longer (Triton's
pytorch backend r24.10 mishandles a batch holding an empty tensor), exactly what a feeding python
step answers. Sessions are the ensemble's request groups (``Plan.request_groups``), which the
workflow answers one row each.
"""

# no `from __future__ import annotations`: TorchScript reads the annotations below as types

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from merlin.schema import Schema
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.data import wire
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.libtorch_batching import unbatchable_reason
from merlin_torch_serving.export.partition import TritonStep
from merlin_torch_serving.export.warmup_files import WARMUP_DIR, write_warmup_arrays
from merlin_torch_serving.graph.plan import REQUEST, Plan

#: what a feeder model's name adds to the name of the step it feeds
FEEDER_SUFFIX = "-sessions"


def session_count(key: torch.Tensor) -> int:
    """The distinct values of a request's session key (``[1, clicks]``)."""
    if key.numel() == 0:
        return 0
    return torch.unique(key.reshape(-1)).shape[0]


def padded(tensor: torch.Tensor) -> torch.Tensor:
    """A request's tensor flat, one element longer, with the batched form's leading 1."""
    flat = tensor.reshape(-1)
    return torch.cat([flat, flat.new_zeros(1)]).unsqueeze(0)


@dataclass(frozen=True)
class Feeder:
    """The feeder of libtorch step ``step``: its model name, the request's session key, and the
    columns it passes on padded (the step's inputs)."""

    name: str
    step: str
    key: str
    input_schema: Schema

    @property
    def tensors(self) -> list[wire.TensorSpec]:
        return wire.schema_specs(self.input_schema)


def request_feeders(plan: Plan, steps: list[TritonStep]) -> list[Feeder]:
    """A feeder for each libtorch step of a batched export that reads only the request and could
    batch (one row per session out), when requests group rows by one session key."""
    groups = plan.request_groups()
    if not groups or len(groups) != 1:
        return []
    feeders = []
    for step in steps:
        if step.backend != "pytorch" or unbatchable_reason(step) is not None:
            continue
        if any(ref.producer != REQUEST for ref in step.inputs.values()):
            continue
        if groups[0] not in step.inputs:
            continue
        feeders.append(Feeder(step.name + FEEDER_SUFFIX, step.name, groups[0], step.input_schema))
    return feeders


def feeder_module(feeder: Feeder) -> torch.jit.ScriptModule:
    """The feeder's TorchScript: ``(ROWS_TENSOR, padded tensors...)`` of one request."""
    returned = ", ".join(
        ["torch.zeros([1, rows], dtype=torch.uint8)"]
        + [f"padded(inputs[{_text(spec.name)}])" for spec in feeder.tensors]
    )
    returns = "Tuple[" + ", ".join(["Tensor"] * (1 + len(feeder.tensors))) + "]"
    source = "\n".join(
        [
            f"def forward(self, inputs: Dict[str, Tensor]) -> {returns}:",
            f"    rows = session_count(inputs[{_text(feeder.key)}])",
            f"    return {returned}",
            "",
        ]
    )

    # a class per feeder: TorchScript keeps the methods a ScriptModule defines on its class
    class SessionFeeder(torch.jit.ScriptModule):
        def __init__(self):
            super().__init__()
            self.define(source)

    return SessionFeeder()


def write_feeder(model_dir: Path, feeder: Feeder, version: int, options, arrays: dict) -> None:
    """The feeder's model folder: ``model.pt``, its config, and the warm-up sample of the step it
    feeds (``arrays``: that step's warm-up request, in the wire form)."""
    (model_dir / str(version)).mkdir(parents=True)
    warmup_files = write_warmup_arrays(
        model_dir / WARMUP_DIR, {spec.name: arrays[spec.name] for spec in feeder.tensors}
    )
    model_file = model_dir / str(version) / configs.LIBTORCH_MODEL_FILE
    torch.jit.save(feeder_module(feeder), str(model_file))
    (model_dir / "config.pbtxt").write_text(
        configs.to_pbtxt(feeder_config(feeder, options, warmup_files))
    )


def feeder_config(feeder: Feeder, options: configs.ModelOptions, warmup_files: dict):
    """A libtorch step of the batched export that answers one request at a time (its request
    tensors in the batched form), whose outputs are ``ROWS_TENSOR`` and each tensor padded."""
    config = configs.pytorch_model_config(
        feeder.name, feeder.input_schema, feeder.input_schema, options, warmup_files
    )
    del config.output[:]
    for name, dtype in [(configs.ROWS_TENSOR, "TYPE_UINT8")] + [
        (spec.name + configs.PADDED_SUFFIX, spec.config_dtype) for spec in feeder.tensors
    ]:
        config.output.add(name=name, data_type=model_config_pb2.DataType.Value(dtype), dims=[1, -1])
    return config


def ensemble_step(feeder: Feeder) -> dict:
    """The feeder's step of the ensemble: request tensors in, its answers under the names the
    fed step's input map reads (``<tensor>__padded``, ``<feeder>/__rows``)."""
    return {
        "model_name": feeder.name,
        "input_map": {spec.name: spec.name for spec in feeder.tensors},
        "output_map": {
            configs.ROWS_TENSOR: f"{feeder.name}/{configs.ROWS_TENSOR}",
            **{
                spec.name + configs.PADDED_SUFFIX: spec.name + configs.PADDED_SUFFIX
                for spec in feeder.tensors
            },
        },
    }


def _text(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)
