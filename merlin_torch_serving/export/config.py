"""config.pbtxt generation: the options users set, and the Triton model configs built from schemas.

Configs are built as dicts, parsed into tritonclient's ``ModelConfig`` protobuf and printed with
``text_format``, so every file is valid by construction and never a string template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import json_format, text_format
from merlin.schema import Schema
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.aot.instruction_sets import instruction_set
from merlin_torch_serving.client import health
from merlin_torch_serving.data import wire

#: ensemble config parameters that carry the full schemas, for clients that build requests
INPUT_SCHEMA_PARAMETER = "merlin_torch_serving.input_schema"
OUTPUT_SCHEMA_PARAMETER = "merlin_torch_serving.output_schema"
#: python-backend step parameter: torch's intra-op threads in that model's process
TORCH_THREADS_PARAMETER = "merlin_torch_serving.torch_threads"
#: python-step parameter, written only as "false": the step publishes no metrics of its own
METRICS_PARAMETER = "merlin_torch_serving.metrics"
#: python-backend parameter: the Python environment (a folder or a .tar.gz) its stub runs in
EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"
INSTANCE_KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO", "KIND_MODEL")
#: rows per request a python step accepts unless ModelOptions says otherwise: the example's XLNet
#: needs ~9 KB of server memory per click (measured: +1.9 GB for 200,000 clicks), so ~1 GB here
DEFAULT_MAX_REQUEST_ROWS = 100_000
#: rows one merged run of a batched step holds by default: 64 one-session requests of 64 clicks
DEFAULT_MAX_BATCH_ROWS = 4096
#: step and ensemble parameter: the most rows a request may hold (python steps refuse more)
MAX_REQUEST_ROWS_PARAMETER = "merlin_torch_serving.max_request_rows"
#: ensemble parameter: "true" when every tensor of a request carries a leading dimension of 1 (the
#: form a step that Triton batches across requests needs; see data/wire.py)
REQUEST_DIM_PARAMETER = "merlin_torch_serving.request_dim"
#: python-backend step parameter: the most rows one merged run of a batch may hold
MAX_BATCH_ROWS_PARAMETER = "merlin_torch_serving.max_batch_rows"
#: python-backend step parameter: JSON of the warm-up sample the stub runs itself (see python_model)
WARMUP_PARAMETER = "merlin_torch_serving.warmup"
#: python step file, beside its config.pbtxt: JSON ``{call index: {config key: value}}``, settings
#: an operator takes from here instead of its exported config when the step loads
#: (``reloadable_config``: a route's experiment weights), so a reload changes them without a new
#: export. A file and not a config parameter: the launcher's failover loads python models with the
#: config it saw first, and a standby copies the file its model loaded with (launcher.standby)
CONFIG_OVERRIDES_FILE = "config_overrides.json"
#: ensemble parameter: JSON list of the request columns that group rows into sessions (a request
#: may be split only between sessions), ``[]`` for independent rows, ``null`` when no split is safe
REQUEST_GROUPS_PARAMETER = "merlin_torch_serving.request_groups"
#: outside services a step's operators call (JSON ``[{"name": ..., "url": ...}]``), for health
SERVICES_PARAMETER = health.SERVICES_PARAMETER
#: batched exports: per request, one byte per row of a libtorch step's input, sent by the python
#: step that feeds it (see libtorch_batching.py)
ROWS_TENSOR = "__rows"
#: batched exports: a tensor as the python step that feeds a libtorch step sends it to that step,
#: flat and one element longer: Triton's pytorch backend r24.10 stops copying a batch's requests at
#: the first request whose tensor is empty (its input collector ends at a request of no buffers)
PADDED_SUFFIX = "__padded"
#: batched libtorch steps: per request of a batch, an input's elements (``BATCH_ELEMENT_COUNT``)
COUNT_SUFFIX = "__count"
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
    batching
        Batch concurrent requests across the wire: Triton's dynamic batcher queues the requests
        that arrive while a step is busy and hands them to it together; the step merges their
        sessions, runs its operators once, and splits the answers back per request (bit for bit
        what answering them one at a time gives; see docs/guides/batching.md). Python steps and
        libtorch steps fed by one python step batch so (``libtorch_batching.py``). Every
        tensor of a request then carries a leading dimension of 1 (``c__values`` is ``[1, n]``),
        which ``Client`` reads from the config; clients that send Merlin Systems' form (``[n]``)
        need ``batching=False``, the default.
    max_batch_rows
        The most rows (clicks; each value of a ragged list counts) one merged run holds: a batch
        with more is run in several merged runs, so the batch size bounds memory as
        ``max_request_rows`` does for one request. Also Triton's ``max_batch_size`` (in requests).
    max_queue_delay_us
        How long Triton may hold a request waiting for others to batch with. 0 (the default) adds
        no latency: requests batch only while the step is busy with earlier ones, which is when
        batching pays (see the benchmark's concurrency sweep).
    instance_kind
        Where each instance runs: ``"KIND_CPU"`` (default), ``"KIND_GPU"``, ``"KIND_AUTO"`` or
        ``"KIND_MODEL"`` (Triton's ``instance_group.kind``).
    version_policy
        Which versions of every model (ensemble included) the server loads: None (Triton's default,
        the newest one), ``"all"``, an int N (the newest N), or a sequence of version numbers.
    response_cache
        Cache the ensemble's answers in Triton's response cache (the server must be started with
        a cache, e.g. ``serve REPOSITORY -- --cache-config=local,size=104857600``).
    rate_limiter
        Triton's ``instance_group.rate_limiter`` of every step model, in its config form:
        ``{"resources": [{"name": "R", "count": 1}], "priority": 1}`` (the server runs it with
        ``--rate-limit=execution_count``).
    parameters
        Extra ``parameters`` (name -> string) of every step model, for backend settings this
        class does not name.
    execution_env
        ``EXECUTION_ENV_PATH`` of every python step: the Python environment (a folder or a
        ``.tar.gz``) its stub runs in; ``$$TRITON_MODEL_DIRECTORY`` stands for the model's
        folder. ``merlin-torch-serving bundle`` sets it, with the stub that fits the environment.
    instruction_set
        The CPU instruction set libtorch steps compiled ahead of time (AOTInductor packages) are
        compiled for: ``"native"`` (this CPU's; a server on a CPU without one of its features
        refuses to load them, naming it), or an x86-64 level every CPU of that level runs:
        ``"x86-64-v3"`` (AVX2, x86 servers of the last decade), ``"x86-64-v4"`` (AVX-512),
        ``"x86-64-v2"``, ``"x86-64"`` (any). See ``aot.instruction_sets``.
    metrics
        Whether python steps publish their own counters (``mts_*`` on the server's metrics
        endpoint: sessions, filtered sessions, out-of-vocabulary ids, fast-path fallbacks, time
        per operator; see ``export.step_metrics``). On by default: they cost a few microseconds
        a request.
    """

    instance_count: int = 1
    warmup_count: int = 3
    torch_threads: int | None = 1
    max_request_rows: int | None = DEFAULT_MAX_REQUEST_ROWS
    batching: bool = False
    max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS
    max_queue_delay_us: int = 0
    instance_kind: str = "KIND_CPU"
    version_policy: str | int | Sequence[int] | None = None
    response_cache: bool = False
    rate_limiter: Mapping | None = None
    parameters: Mapping[str, str] | None = None
    execution_env: str | None = None
    metrics: bool = True
    instruction_set: str = "native"

    def __post_init__(self):
        if self.instance_kind not in INSTANCE_KINDS:
            raise ValueError(
                f"instance_kind must be one of {INSTANCE_KINDS}, got {self.instance_kind!r}"
            )
        _version_policy(self.version_policy)  # raises on nonsense
        instruction_set(self.instruction_set)  # raises on an unknown name
        if self.rate_limiter is not None:
            _parse({"instance_group": [{"rate_limiter": dict(self.rate_limiter)}]}, "rate_limiter")
        own = {
            TORCH_THREADS_PARAMETER,
            MAX_REQUEST_ROWS_PARAMETER,
            EXECUTION_ENV_PARAMETER,
            METRICS_PARAMETER,
            MAX_BATCH_ROWS_PARAMETER,
            WARMUP_PARAMETER,
            "INTRA_OP_THREAD_COUNT",
        }
        reserved = own & set(self.parameters or {})
        if reserved:
            raise ValueError(
                f"parameters {sorted(reserved)} are set through ModelOptions' own fields "
                "(torch_threads, max_request_rows, max_batch_rows, warmup_count, execution_env, "
                "metrics); pass them there"
            )
        if self.instance_count < 1:
            raise ValueError(f"instance_count must be at least 1, got {self.instance_count!r}")
        if self.warmup_count < 0:
            raise ValueError(f"warmup_count must be 0 or more, got {self.warmup_count!r}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(
                f"torch_threads must be at least 1 or None, got {self.torch_threads!r}"
            )
        if self.max_request_rows is not None and self.max_request_rows < 1:
            raise ValueError(
                f"max_request_rows must be at least 1 or None, got {self.max_request_rows!r}"
            )
        if self.max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be at least 1, got {self.max_batch_rows!r}")
        if self.max_queue_delay_us < 0:
            raise ValueError(
                f"max_queue_delay_us must be 0 or more, got {self.max_queue_delay_us!r}"
            )


def tensor_configs(
    schema: Schema, request_dim: bool = False, ragged_batch: bool = False
) -> list[dict]:
    """``input``/``output`` entries for a schema, in wire format; ``request_dim`` puts the leading
    dimension of 1 of the batched form in the dims (models Triton does not batch),
    ``ragged_batch`` lets Triton batch requests of different lengths (inputs of batched models)."""
    configs = []
    for spec in wire.schema_specs(schema):
        entry: dict[str, object] = {
            "name": spec.name,
            "data_type": spec.config_dtype,
            "dims": [1, *spec.dims] if request_dim else list(spec.dims),
        }
        if ragged_batch:
            entry["allow_ragged_batch"] = True
        configs.append(entry)
    return configs


def python_model_config(
    name: str,
    input_schema: Schema,
    output_schema: Schema,
    options: ModelOptions,
    warmup_files: dict,
    feeds: Sequence[wire.TensorSpec] = (),
    services: Sequence[dict] = (),
) -> model_config_pb2.ModelConfig:
    """A python-backend model hosting operators through the library's generic model.py.

    Unbatched, ``max_batch_size`` is 0: requests carry interaction rows and a step may return
    fewer rows (sessions) than it got, so Triton must not batch on the first dimension (see
    data/wire.py). Batched, every request is one item of Triton's batch (its tensors ``[1, ...]``),
    of any length (``allow_ragged_batch``), and the step merges a batch's requests itself; it
    then warms up in its own stub (``WARMUP_PARAMETER``), on single and merged requests: that
    covers the merged path, and the bundled tritonserver 2.51 was seen to crash (SIGSEGV) loading
    such a model with a ``model_warmup`` of its own. ``feeds``: outputs a batched libtorch step
    reads; the step then also answers them padded, and ``ROWS_TENSOR`` (libtorch_batching.py).
    """
    parameters = {
        **(options.parameters or {}),
        TORCH_THREADS_PARAMETER: options.torch_threads,
        MAX_REQUEST_ROWS_PARAMETER: options.max_request_rows,
        EXECUTION_ENV_PARAMETER: options.execution_env,
        METRICS_PARAMETER: None if options.metrics else "false",
        SERVICES_PARAMETER: json.dumps(list(services)) if services else None,
    }
    batched = options.batching
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": options.max_batch_rows if batched else 0,
        "input": tensor_configs(input_schema, ragged_batch=batched),
        "output": tensor_configs(output_schema) + _padded_configs(feeds),
        "instance_group": _instance_group(options),
        "model_warmup": [] if batched else _warmup(warmup_files, options),
        **_version_policy(options.version_policy),
    }
    if batched:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": options.max_queue_delay_us}
        parameters[MAX_BATCH_ROWS_PARAMETER] = options.max_batch_rows
        if options.warmup_count and warmup_files:
            parameters[WARMUP_PARAMETER] = json.dumps(
                {"count": options.warmup_count, "inputs": warmup_files}
            )
    config["parameters"] = _parameters(parameters)
    return _parse(config)


def pytorch_model_config(
    name: str,
    input_schema: Schema,
    output_schema: Schema,
    options: ModelOptions,
    warmup_files: dict,
    merged: bool = False,
    model_file: str = LIBTORCH_MODEL_FILE,
) -> model_config_pb2.ModelConfig:
    """The config of a libtorch model (``model_file``: TorchScript, or a package's ``.pt2``).

    One ``Dict[str, Tensor]`` input keyed by input names; outputs by position. ``merged``: the
    module answers a whole batch of requests at once (see libtorch_batching.py); otherwise a
    batched export's module takes and returns the batched form one request at a time (see
    request_dim.py).
    """
    config = {
        "name": name,
        "platform": "pytorch_libtorch",
        "backend": "pytorch",
        "max_batch_size": 0,
        "input": tensor_configs(input_schema, request_dim=options.batching),
        "output": tensor_configs(output_schema, request_dim=options.batching),
        "instance_group": _instance_group(options),
        "default_model_filename": model_file,
        "parameters": _libtorch_parameters(options),
        "model_warmup": _warmup(warmup_files, options, request_dim=options.batching),
        **_version_policy(options.version_policy),
    }
    if merged:
        outputs = tensor_configs(output_schema)
        config.update(
            {
                "max_batch_size": options.max_batch_rows,
                "input": [
                    {**entry, "allow_ragged_batch": True}
                    for entry in _padded_configs(wire.schema_specs(input_schema), padded=False)
                ],
                "output": outputs,
                "batch_input": [
                    {
                        "kind": "BATCH_ELEMENT_COUNT",
                        "target_name": [entry["name"] + COUNT_SUFFIX],
                        "data_type": "TYPE_INT32",
                        "source_input": [entry["name"]],
                    }
                    for entry in _padded_configs(wire.schema_specs(input_schema), padded=False)
                ],
                # each request's answer is its rows: shaped [1, rows, ...] as its ROWS_TENSOR
                "batch_output": [
                    {
                        "target_name": [output["name"]],
                        "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE",
                        "source_input": [ROWS_TENSOR],
                    }
                    for output in outputs
                ],
                "dynamic_batching": {"max_queue_delay_microseconds": options.max_queue_delay_us},
                "model_warmup": _warmup(warmup_files, options),
            }
        )
    return _parse(config)


def to_pbtxt(config: model_config_pb2.ModelConfig) -> str:
    return text_format.MessageToString(config)


def from_pbtxt(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _padded_configs(specs: Sequence[wire.TensorSpec], padded: bool = True) -> list[dict]:
    """The flat tensors a python step sends a batched libtorch step: ``ROWS_TENSOR``, and each of
    ``specs`` flattened with one element more (named with ``PADDED_SUFFIX`` where ``padded``)."""
    if not specs:
        return []
    suffix = PADDED_SUFFIX if padded else ""
    return [
        {"name": ROWS_TENSOR, "data_type": "TYPE_UINT8", "dims": [-1]},
        *({"name": s.name + suffix, "data_type": s.config_dtype, "dims": [-1]} for s in specs),
    ]


def _libtorch_parameters(options: ModelOptions) -> dict:
    # as models run in-process: no per-shape re-optimisation (see ops/pytorch.py)
    return _parameters(
        {
            **(options.parameters or {}),
            "INFERENCE_MODE": "true",
            "DISABLE_OPTIMIZED_EXECUTION": "true",
            "INTRA_OP_THREAD_COUNT": options.torch_threads,
        }
    )


def _instance_group(options: ModelOptions) -> list[dict]:
    group = {"kind": options.instance_kind, "count": options.instance_count}
    if options.rate_limiter is not None:
        group["rate_limiter"] = dict(options.rate_limiter)
    return [group]


def _version_policy(policy) -> dict:
    """The config's ``version_policy`` entry (empty for Triton's default, the newest version)."""
    if policy is None:
        return {}
    if policy == "all":
        return {"version_policy": {"all": {}}}
    if isinstance(policy, int) and not isinstance(policy, bool) and policy >= 1:
        return {"version_policy": {"latest": {"num_versions": policy}}}
    if (
        isinstance(policy, Sequence)
        and not isinstance(policy, str)
        and policy
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in policy)
    ):
        return {"version_policy": {"specific": {"versions": list(policy)}}}
    raise ValueError(
        "version_policy must be None, 'all', a number of newest versions (1 or more) or a sequence"
        f" of version numbers, got {policy!r}"
    )


def _parameters(values: dict) -> dict:
    """Config ``parameters`` from the values that are set (Triton's parameters are strings)."""
    return {key: {"string_value": str(value)} for key, value in values.items() if value is not None}


def _warmup(warmup_files: dict, options: ModelOptions, request_dim: bool = False) -> list[dict]:
    """One warm-up sample; ``warmup_files`` maps input name -> (file name, config dtype, dims)."""
    if options.warmup_count == 0 or not warmup_files:
        return []
    lead = [1] if request_dim else []
    inputs = {
        name: {"data_type": dtype, "dims": [*lead, *dims], "input_data_file": file_name}
        for name, (file_name, dtype, dims) in warmup_files.items()
    }
    # batch_size 1: Triton skips samples of batch size 0; without batching, dims are the request's
    return [{"name": "sample", "batch_size": 1, "count": options.warmup_count, "inputs": inputs}]


def _parse(config: dict, option: str | None = None) -> model_config_pb2.ModelConfig:
    try:
        return json_format.ParseDict(config, model_config_pb2.ModelConfig())
    except json_format.ParseError as error:
        if option is None:
            raise
        raise ValueError(f"{option} is not valid in a Triton model config: {error}") from None
