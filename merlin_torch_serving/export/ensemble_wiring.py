"""The ensemble model: which ensemble tensor every step reads and writes, and its config.

Each column ref travels as one ensemble tensor per wire tensor: request columns under their own
names, ensemble outputs under their response names (``wire.response_name``), every other step
output as ``<step>/<column>``. A batched libtorch step reads its feeder's padded tensors and rows
instead (see ``libtorch_batching``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from merlin.schema import Schema
from tritonclient.grpc import model_config_pb2

from merlin_torch_serving.data import wire
from merlin_torch_serving.data.schemas import schema_to_json
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export.partition import TritonStep
from merlin_torch_serving.graph.plan import REQUEST, Plan, Ref


def ensemble_model_config(
    name: str,
    ensemble,
    plan: Plan,
    steps: list[TritonStep],
    options: configs.ModelOptions,
    rows_from: dict[str, str],
    feeds: dict[str, list[wire.TensorSpec]],
    feeder_steps: Sequence[dict] = (),
) -> model_config_pb2.ModelConfig:
    """The ensemble's config; ``rows_from`` and ``feeds`` as ``libtorch_batching`` gives them,
    ``feeder_steps`` the steps of the session feeders (``libtorch_feeder``), run first."""
    names = tensor_names(plan, steps)
    step_configs: list[dict[str, dict[str, str]]] = []
    for step in steps:
        input_map = _wire_map(step.input_schema, step.inputs, names)
        output_map = _wire_map(step.output_schema, step.outputs, names)
        if step.name in rows_from:
            input_map = {
                model: tensor + configs.PADDED_SUFFIX for model, tensor in input_map.items()
            }
            input_map[configs.ROWS_TENSOR] = f"{rows_from[step.name]}/{configs.ROWS_TENSOR}"
        for spec in feeds.get(step.name, []):
            output_map[spec.name + configs.PADDED_SUFFIX] = (
                output_map[spec.name] + configs.PADDED_SUFFIX
            )
        if step.name in feeds:
            output_map[configs.ROWS_TENSOR] = f"{step.name}/{configs.ROWS_TENSOR}"
        step_configs.append({"input_map": input_map, "output_map": output_map})
    response_schema = Schema(
        [
            c.with_name(wire.response_name(c.name, plan.input_schema.column_names))
            for c in ensemble.output_schema
        ]
    )
    # Triton refuses an ensemble tensor that no step reads: a feeder's tensors that only a batched
    # libtorch step read travel padded alone
    read = {t for c in step_configs for t in c["input_map"].values()}
    read |= {spec.name for spec in wire.schema_specs(response_schema)}
    for step, maps in zip(steps, step_configs, strict=True):
        if step.name in feeds:
            maps["output_map"] = {model: t for model, t in maps["output_map"].items() if t in read}
    return ensemble_config(
        name,
        ensemble.input_schema,
        response_schema,
        ensemble.output_schema,
        [
            *feeder_steps,
            *(
                {"model_name": step.name, **maps}
                for step, maps in zip(steps, step_configs, strict=True)
            ),
        ],
        plan.request_groups(),
        options,
    )


def ensemble_config(
    name: str,
    input_schema: Schema,
    response_schema: Schema,
    output_schema: Schema,
    steps: list[dict],
    request_groups: list[str] | None,
    options: configs.ModelOptions,
) -> model_config_pb2.ModelConfig:
    """A native Triton ensemble; ``steps`` are ``{model_name, input_map, output_map}`` dicts.

    ``response_schema`` is the output schema under the names outputs travel as (see
    ``wire.response_name``); the ensemble's own ``output_schema`` is kept in a parameter, with
    what clients need to split big requests (``request_groups``, the row limit).
    """
    return configs._parse(
        {
            "name": name,
            "platform": "ensemble",
            "max_batch_size": 0,
            "input": configs.tensor_configs(input_schema, request_dim=options.batching),
            "output": configs.tensor_configs(response_schema, request_dim=options.batching),
            "ensemble_scheduling": {"step": [{"model_version": -1, **step} for step in steps]},
            "parameters": configs._parameters(
                {
                    configs.INPUT_SCHEMA_PARAMETER: schema_to_json(input_schema),
                    configs.OUTPUT_SCHEMA_PARAMETER: schema_to_json(output_schema),
                    configs.REQUEST_GROUPS_PARAMETER: json.dumps(request_groups),
                    configs.MAX_REQUEST_ROWS_PARAMETER: options.max_request_rows,
                    configs.REQUEST_DIM_PARAMETER: "true" if options.batching else None,
                }
            ),
            **({"response_cache": {"enable": True}} if options.response_cache else {}),
            **configs._version_policy(options.version_policy),
        }
    )


def tensor_names(plan: Plan, steps: list[TritonStep]) -> dict[Ref, str]:
    """Ensemble tensor name of each column ref (before wire suffixes)."""
    request_names = plan.input_schema.column_names
    names = {ref: wire.response_name(output, request_names) for output, ref in plan.outputs.items()}
    for name in plan.input_schema.column_names:
        names[Ref(REQUEST, name)] = name
    for step in steps:
        for ref in step.outputs.values():
            names.setdefault(ref, f"{step.name}/{ref.column}")
    return names


def _wire_map(schema, refs: dict[str, Ref], names: dict[Ref, str]) -> dict[str, str]:
    """Model tensor name -> ensemble tensor name, per wire tensor of each column."""
    mapping = {}
    for column in schema:
        ensemble_name = names[refs[column.name]]
        for spec in wire.column_specs(column):
            suffix = spec.name[len(column.name) :]
            mapping[spec.name] = ensemble_name + suffix
    return mapping
