"""The served models of an operator's sub-graphs (a route's branches), as the export tells them to
the served operator: one JSON file in the operator's artifact folder, written by the exporter
after the operator's own files (see ``ServingOperator.sub_graphs``). A sub-graph the operator hosts
in its own step (``ServingOperator.inline_sub_graphs``) is a python step written into a folder
beside that file instead of a model."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from merlin.schema import Schema

from merlin_torch_serving.data.schemas import schema_from_json, schema_to_json

SUB_MODELS_FILE = "sub_models.json"


@dataclass(frozen=True)
class SubModel:
    """The Triton ensemble a sub-graph was exported as: its model name, the columns it takes and
    returns, and whether its tensors carry the batched form's leading dimension of 1; or, with
    ``inline``, the folder of the python step it was written as inside the operator's own."""

    model: str
    input_schema: Schema
    output_schema: Schema
    request_dim: bool = False
    inline: str | None = None


def write_sub_models(folder: str | os.PathLike, models: dict[str, SubModel]) -> None:
    record = {
        name: {
            "model": sub.model,
            "input_schema": schema_to_json(sub.input_schema),
            "output_schema": schema_to_json(sub.output_schema),
            "request_dim": sub.request_dim,
            "inline": sub.inline,
        }
        for name, sub in models.items()
    }
    with open(os.path.join(folder, SUB_MODELS_FILE), "w") as file:
        json.dump(record, file, indent=1)


def read_sub_models(folder: str | os.PathLike) -> dict[str, SubModel]:
    """The sub-models the export recorded in ``folder`` (``{}`` when it recorded none)."""
    path = os.path.join(folder, SUB_MODELS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as file:
        record = json.load(file)
    return {
        name: SubModel(
            entry["model"],
            schema_from_json(entry["input_schema"]),
            schema_from_json(entry["output_schema"]),
            bool(entry.get("request_dim", False)),
            os.path.join(folder, entry["inline"]) if entry.get("inline") else None,
        )
        for name, entry in record.items()
    }
