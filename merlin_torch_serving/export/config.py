"""config.pbtxt generation: the options users set, and the Triton model configs built from schemas.

Configs are built as dicts, parsed into tritonclient's ``ModelConfig`` protobuf and printed with
``text_format``, so every file is valid by construction and never a string template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from google.protobuf import json_format, text_format
from merlin.schema import Schema
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving import wire
from merlin_torch_serving.schemas import schema_to_json

#: ensemble config parameters that carry the full schemas, for clients that build requests
INPUT_SCHEMA_PARAMETER = "merlin_torch_serving.input_schema"
OUTPUT_SCHEMA_PARAMETER = "merlin_torch_serving.output_schema"
#: python-backend step parameter: torch's intra-op threads in that model's process
TORCH_THREADS_PARAMETER = "merlin_torch_serving.torch_threads"
#: rows per request a python step accepts unless ModelOptions says otherwise: the example's XLNet
#: needs ~9 KB of server memory per click (measured: +1.9 GB for 200,000 clicks), so ~1 GB here
DEFAULT_MAX_REQUEST_ROWS = 100_000
#: step and ensemble parameter: the most rows a request may hold (python steps refuse more)
MAX_REQUEST_ROWS_PARAMETER = "merlin_torch_serving.max_request_rows"
#: ensemble parameter: JSON list of the request columns that group rows into sessions (a request
#: may be split only between sessions), ``[]`` for independent rows, ``null`` when no split is safe
REQUEST_GROUPS_PARAMETER = "merlin_torch_serving.request_groups"
#: the TorchScript file of a libtorch step
LIBTORCH_MODEL_FILE = "model.pt"


@dataclass(frozen=True)
class ModelOptions:
    """How each generated step model is configured.

    instance_count
        CPU instances of every step model: how many requests one step serves at once.
    warmup_count
        How many times Triton runs a sample request through each step model while loading it,
        so the first real request does not pay for lazy initialisation (0 turns warm-up off).
    torch_threads
        torch's intra-op threads per model instance (python backend: ``torch.set_num_threads`` in
        the instance's stub; libtorch: ``INTRA_OP_THREAD_COUNT``, which Triton's pytorch backend
        applies to the whole server process, so every libtorch model of a server shares one
        count; the export warns when a repository's libtorch models ask for different ones).
        One thread per instance, scaled with ``instance_count``, is the default: with torch's
        own default (``None``, a thread per core in every stub and in the server) the pools of
        two models oversubscribe the cores and latency jumps tenfold as soon as both are busy,
        or anything else on the machine is. Float sums over a different number of threads may
        run in another order: served scores equal in-process scores bit for bit when the
        in-process run uses the same count, as ``LocalExecutor`` does by default (one thread).
    max_request_rows
        The most rows one request may hold (each value of a ragged list counts as a row); python
        steps refuse bigger requests with an error naming the limit, so that one request cannot
        take the machine's memory. ``Client`` splits bigger inputs by whole sessions to fit.
        ``None`` sets no limit.
    """

    instance_count: int = 1
    warmup_count: int = 3
    torch_threads: int | None = 1
    max_request_rows: int | None = DEFAULT_MAX_REQUEST_ROWS

    def __post_init__(self):
        if self.instance_count < 1:
            raise ValueError(f"instance_count must be at least 1, got {self.instance_count!r}")
        if self.warmup_count < 0:
            raise ValueError(f"warmup_count must be 0 or more, got {self.warmup_count!r}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be at least 1 or None, got {self.torch_threads!r}")
        if self.max_request_rows is not None and self.max_request_rows < 1:
            raise ValueError(f"max_request_rows must be at least 1 or None, got {self.max_request_rows!r}")


def tensor_configs(schema: Schema) -> list[dict]:
    """``input``/``output`` entries for a schema, in wire format."""
    return [
        {"name": spec.name, "data_type": spec.config_dtype, "dims": list(spec.dims)}
        for spec in wire.schema_specs(schema)
    ]


def python_model_config(
    name: str, input_schema: Schema, output_schema: Schema, options: ModelOptions, warmup_files: dict
) -> model_config_pb2.ModelConfig:
    """A python-backend model hosting operators through the library's generic model.py."""
    return _parse(
        {
            "name": name,
            "backend": "python",
            # max_batch_size 0: requests carry interaction rows and a step may return fewer rows
            # (sessions) than it got, so Triton must not batch on the first dimension (see wire.py)
            "max_batch_size": 0,
            "input": tensor_configs(input_schema),
            "output": tensor_configs(output_schema),
            "instance_group": [{"kind": "KIND_CPU", "count": options.instance_count}],
            "parameters": _parameters(
                {TORCH_THREADS_PARAMETER: options.torch_threads, MAX_REQUEST_ROWS_PARAMETER: options.max_request_rows}
            ),
            "model_warmup": _warmup(warmup_files, options),
        }
    )


def pytorch_model_config(
    name: str, input_schema: Schema, output_schema: Schema, options: ModelOptions, warmup_files: dict
) -> model_config_pb2.ModelConfig:
    """A libtorch model: one ``Dict[str, Tensor]`` input keyed by input names, outputs by position."""
    return _parse(
        {
            "name": name,
            "platform": "pytorch_libtorch",
            "backend": "pytorch",
            "max_batch_size": 0,
            "input": tensor_configs(input_schema),
            "output": tensor_configs(output_schema),
            "instance_group": [{"kind": "KIND_CPU", "count": options.instance_count}],
            "default_model_filename": LIBTORCH_MODEL_FILE,
            # as models run in-process: no per-shape re-optimisation (see ops/pytorch.py)
            "parameters": _parameters(
                {
                    "INFERENCE_MODE": "true",
                    "DISABLE_OPTIMIZED_EXECUTION": "true",
                    "INTRA_OP_THREAD_COUNT": options.torch_threads,
                }
            ),
            "model_warmup": _warmup(warmup_files, options),
        }
    )


def ensemble_config(
    name: str,
    input_schema: Schema,
    response_schema: Schema,
    output_schema: Schema,
    steps: list[dict],
    request_groups: list[str] | None,
    options: ModelOptions,
) -> model_config_pb2.ModelConfig:
    """A native Triton ensemble; ``steps`` are ``{model_name, input_map, output_map}`` dicts.

    ``response_schema`` is the output schema under the names outputs travel as (see
    ``wire.response_name``); the ensemble's own ``output_schema`` is kept in a parameter, with
    what clients need to split big requests (``request_groups``, the row limit).
    """
    return _parse(
        {
            "name": name,
            "platform": "ensemble",
            "max_batch_size": 0,
            "input": tensor_configs(input_schema),
            "output": tensor_configs(response_schema),
            "ensemble_scheduling": {"step": [{"model_version": -1, **step} for step in steps]},
            "parameters": _parameters(
                {
                    INPUT_SCHEMA_PARAMETER: schema_to_json(input_schema),
                    OUTPUT_SCHEMA_PARAMETER: schema_to_json(output_schema),
                    REQUEST_GROUPS_PARAMETER: json.dumps(request_groups),
                    MAX_REQUEST_ROWS_PARAMETER: options.max_request_rows,
                }
            ),
        }
    )


def to_pbtxt(config: model_config_pb2.ModelConfig) -> str:
    return text_format.MessageToString(config)


def from_pbtxt(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _parameters(values: dict) -> dict:
    """Config ``parameters`` from the values that are set (Triton's parameters are strings)."""
    return {key: {"string_value": str(value)} for key, value in values.items() if value is not None}


def _warmup(warmup_files: dict, options: ModelOptions) -> list[dict]:
    """One warm-up sample; ``warmup_files`` maps input name -> (file name, config dtype, dims)."""
    if options.warmup_count == 0 or not warmup_files:
        return []
    inputs = {
        name: {"data_type": dtype, "dims": list(dims), "input_data_file": file_name}
        for name, (file_name, dtype, dims) in warmup_files.items()
    }
    # batch_size 1: Triton skips samples of batch size 0, and with max_batch_size 0 the dims are
    # the whole request shape
    return [{"name": "sample", "batch_size": 1, "count": options.warmup_count, "inputs": inputs}]


def _parse(config: dict) -> model_config_pb2.ModelConfig:
    return json_format.ParseDict(config, model_config_pb2.ModelConfig())
