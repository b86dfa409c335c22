"""Merlin Systems 23.08 serving the multi-stage pipeline with its own operators:
``TransformWorkflow`` -> the session encoder -> ``QueryFaiss`` -> ``FilterCandidates`` -> item and
session features -> ``UnrollFeatures`` -> ``PredictPyTorch`` (the ranker, on the libtorch backend
built here) -> ``SoftmaxSampling``, on the same workflow, faiss index, models and feature table as
this project's pipeline in multistage.py.

Its libtorch models get the executor settings this project's libtorch steps run with (see
``_run_libtorch_as_this_project_does``). Two substitutions, both needed to serve at all:

- QueryFeast -> ``TableFeatures`` (below): Merlin's ``QueryFeast`` imports Feast in the serving
  process, and no Feast release installs beside merlin-systems 23.08 and its pinned stack. The
  substitute reads the same feature table (item features by encoded id, the session's device by
  session id) with one numpy gather per feature, the work an exported table lookup does.
- the session encoder runs in ``PredictTorchScriptInExecutor`` (benchmarks/merlin_baseline.py),
  as in the main benchmark: Merlin's libtorch step cannot take the workflow's ragged lists.

Merlin's operators answer one session per request: ``QueryFaiss`` and ``FilterCandidates`` flatten
every session of a request into one list and ``SoftmaxSampling`` returns one row, so each request
carries one session.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cloudpickle
import numpy as np
import torch
from merlin.dag import BaseOperator
from merlin.schema import ColumnSchema, Schema
from merlin.systems.dag import Ensemble as MerlinEnsemble
from merlin.systems.dag.ops.faiss import QueryFaiss
from merlin.systems.dag.ops.pytorch import PredictPyTorch
from merlin.systems.dag.ops.session_filter import FilterCandidates
from merlin.systems.dag.ops.softmax_sampling import SoftmaxSampling
from merlin.systems.dag.ops.unroll_features import UnrollFeatures
from merlin.systems.dag.ops.workflow import TransformWorkflow as MerlinTransformWorkflow

from benchmarks.merlin_baseline import PredictTorchScriptInExecutor

SUBSTITUTION_NOTE = (
    "Merlin's QueryFeast was replaced by TableFeatures (benchmarks/merlin_multistage.py), a"
    " merlin.dag operator reading the same feature table with one numpy gather per feature:"
    " QueryFeast imports Feast in the serving process, and no Feast release installs beside"
    " merlin-systems 23.08. The session encoder runs in PredictTorchScriptInExecutor (Merlin's"
    " libtorch step cannot take ragged lists), with one torch thread; the ranker is Merlin's stock"
    " PredictPyTorch, served"
    " on the libtorch backend built here. One session per request: Merlin's QueryFaiss,"
    " FilterCandidates and SoftmaxSampling flatten a request's sessions into one. Merlin's libtorch"
    " models run with the settings this project's do (TorchScript's optimizing executor off,"
    " inference mode, one torch thread)."
)


class TableFeatures(BaseOperator):
    """Stand-in for QueryFeast: ``features`` (name -> array indexed by key) of the keys in
    ``key_column``; keys outside the arrays get 0."""

    def __init__(self, key_column: str, features: dict[str, np.ndarray]):
        super().__init__()
        self.key_column = key_column
        self.features = features

    @property
    def label(self) -> str:
        return f"TableFeatures({', '.join(self.features)})"

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None):
        return Schema(
            [ColumnSchema(name, dtype=values.dtype) for name, values in self.features.items()]
        )

    def transform(self, col_selector, transformable):
        keys = np.asarray(transformable[self.key_column].values).reshape(-1).astype(np.int64)
        outputs = {}
        for name, values in self.features.items():
            inside = (keys >= 0) & (keys < len(values))
            outputs[name] = np.where(inside, values[np.clip(keys, 0, len(values) - 1)], 0).astype(
                values.dtype
            )
        return type(transformable)(outputs)


def export_merlin_multistage(
    workflow,
    session_model,
    ranker: torch.jit.ScriptModule,
    faiss_index_path: Path,
    item_features: dict[str, np.ndarray],
    session_devices: np.ndarray,
    repository: Path,
    *,
    candidates: int,
    top_k: int,
    temperature: float,
    max_sequence_length: int,
) -> list[str]:
    """Export Merlin's pipeline into ``repository``; returns its output names."""
    from merlin_torch_serving.model_prep.next_item import session_encoder

    encoder = _traced_encoder(session_encoder(session_model), session_model, max_sequence_length)
    dimension = int(
        encoder(
            {
                n: torch.zeros((1, max_sequence_length), dtype=torch.int64)
                for n in session_model.input_schema.column_names
            }
        ).shape[1]
    )
    encode = PredictTorchScriptInExecutor(
        encoder,
        session_model.input_schema,
        Schema([ColumnSchema("session_embedding", dtype="float32", dims=(None, dimension))]),
    )
    encode.max_sequence_length = max_sequence_length
    session = workflow.input_schema.column_names >> MerlinTransformWorkflow(workflow)
    retrieved = session >> encode >> QueryFaiss(str(faiss_index_path), topk=candidates)
    filtered = retrieved["candidate_ids"] >> FilterCandidates(filter_out=session["item_id-list"])
    items = filtered >> TableFeatures("filtered_ids", item_features)
    device = session["session_id"] >> TableFeatures("session_id", {"device": session_devices})
    # UnrollFeatures repeats the columns its dependency selects: select them by name
    rows = (filtered + items) >> UnrollFeatures("filtered_ids", device["device"])
    ranker_inputs = Schema(
        [ColumnSchema(name, dtype=values.dtype) for name, values in item_features.items()]
        + [ColumnSchema("device", dtype=session_devices.dtype)]
    )
    ranked = rows >> PredictPyTorch(
        ranker, ranker_inputs, Schema([ColumnSchema("click_probability", dtype="float32")])
    )
    ordered = filtered["filtered_ids"] >> SoftmaxSampling(
        relevance_col=ranked["click_probability"], topk=top_k, temperature=temperature
    )
    ensemble = MerlinEnsemble(ordered, workflow.input_schema)
    # the executor unpickles the graph in the stub, which cannot import `benchmarks`
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cloudpickle.register_pickle_by_value(sys.modules["benchmarks.merlin_baseline"])
    ensemble.export(str(repository))
    _run_libtorch_as_this_project_does(repository)
    return ensemble.output_schema.column_names


def _run_libtorch_as_this_project_does(repository: Path) -> None:
    """Give Merlin's libtorch models the settings this project's libtorch steps run with:
    TorchScript's optimizing executor off (it re-specialises for every new candidate count, ~0.3 s
    each on this machine, and Merlin's configs leave it on), inference mode, one torch thread. The
    comparison is then of the pipelines, not of TorchScript's executor."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    for path in repository.glob("*/config.pbtxt"):
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        if config.backend != "pytorch" and config.platform != "pytorch_libtorch":
            continue
        for key, value in (
            ("DISABLE_OPTIMIZED_EXECUTION", "true"),
            ("INFERENCE_MODE", "true"),
            ("INTRA_OP_THREAD_COUNT", "1"),
        ):
            config.parameters[key].string_value = value
        path.write_text(text_format.MessageToString(config))


def _traced_encoder(encoder, session_model, max_sequence_length: int) -> torch.jit.ScriptModule:
    example = {
        name: torch.full((2, max_sequence_length), 3, dtype=torch.int64)
        for name in session_model.input_schema.column_names
    }
    with torch.no_grad():
        return torch.jit.trace(encoder, (example,), strict=False)
