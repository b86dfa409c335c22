"""Merlin Systems 23.08 on the same workflow and model: ``Ensemble(TransformWorkflow(workflow) >>
PredictPyTorch(traced_model, ...))``, with PredictPyTorch swapped for a python-backend TorchScript
step, because its stock export puts the traced model on Triton's libtorch backend, where nothing
pads the workflow's ragged lists into the dense inputs the model was traced with.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import torch
from merlin.schema import ColumnSchema, Schema
from merlin.systems.dag import Ensemble as MerlinEnsemble
from merlin.systems.dag.ops.pytorch import PredictPyTorch
from merlin.systems.dag.ops.workflow import TransformWorkflow as MerlinTransformWorkflow
from merlin.table import TensorTable

# Merlin's default name for the model that runs the whole ensemble
MERLIN_MODEL = "executor_model"
SCORES_COLUMN = "item_id_scores"
IDS_COLUMN = "item_ids"

SWAP_NOTE = (
    "Merlin Systems' PredictPyTorch step was swapped for a python-backend TorchScript step"
    " (PredictTorchScriptInExecutor, a ~30-line subclass defined in benchmarks/merlin_baseline.py):"
    " the stock export always puts the traced model on Triton's libtorch backend, where nothing"
    " pads the workflow's ragged lists into the dense inputs it was traced with. The swapped step"
    " runs the same traced model inside Merlin's python executor model, after Merlin's"
    " TransformWorkflow step, with one torch thread (as this project's steps run)."
)


class PredictTorchScriptInExecutor(PredictPyTorch):
    """Workaround, not part of Merlin Systems: run the TorchScript model in the python executor.

    Merlin's Triton runtime swaps operators by exact type, so this subclass is not turned into a
    libtorch model and runs inside ``executor_model`` instead. It also does what stock
    PredictPyTorch does not for a session model: keeps the model as an artifact (stock drops it
    when pickled), pads the ragged workflow lists to the dense inputs the traced model takes
    (stock squeezes them), and returns every output tensor whole (stock returns one score column).
    """

    max_sequence_length = 20

    def save_artifacts(self, artifact_path):
        torch.jit.save(self.model, os.path.join(artifact_path, "model.pt"))

    def load_artifacts(self, artifact_path):
        path = os.path.join(artifact_path or "", "model.pt")
        if artifact_path and os.path.exists(path):  # Merlin also calls this with "" while building
            self.model = torch.jit.load(path, map_location="cpu").eval()
            # in the executor model's stub: one torch thread, as this project's steps and Merlin's
            # libtorch models here run (torch's default of one a core slows badly on a busy machine)
            torch.set_num_threads(1)

    def transform(self, col_selector, transformable):
        returns_table = isinstance(transformable, TensorTable)
        table = transformable if returns_table else TensorTable.from_df(transformable)
        inputs = {
            name: torch.from_numpy(self._dense(table[name]))
            for name in self.input_schema.column_names
        }
        with torch.inference_mode():
            outputs = self.model(inputs)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        result = TensorTable(
            {
                name: t.numpy()
                for name, t in zip(self.output_schema.column_names, outputs, strict=True)
            }
        )
        return result if returns_table else result.to_df()

    def _dense(self, column) -> np.ndarray:
        """Each row's last ``max_sequence_length`` values, right-padded with 0.

        That is how the model was trained.
        """
        values = np.asarray(column.values).astype(np.int64, copy=False)
        if column.offsets is None:
            return values.reshape(-1, self.max_sequence_length)
        offsets = np.asarray(column.offsets).astype(np.int64)
        lengths = np.minimum(np.diff(offsets), self.max_sequence_length)
        positions = np.arange(self.max_sequence_length)[None, :]
        filled = positions < lengths[:, None]
        dense = np.zeros((len(lengths), self.max_sequence_length), dtype=np.int64)
        dense[filled] = values[((offsets[1:] - lengths)[:, None] + positions)[filled]]
        return dense


def export_merlin_systems(
    workflow, session_model, repository: Path, *, top_k: int, max_sequence_length: int
) -> list[str]:
    """Trace the model with Transformers4Rec's own top-k, export Merlin's ensemble to
    ``repository`` and return the output names of ``executor_model``.

    The model answers with its ``top_k`` best ids and scores, so both systems send back ten items
    per session (Merlin's without excluding seen or reserved ids, and with ids still encoded).
    """
    traced = trace_top_k(session_model, top_k, max_sequence_length)
    output_schema = Schema(
        [
            # Transformers4Rec declares [-1, catalog] for these; the traced model returns [-1, k]
            ColumnSchema(SCORES_COLUMN, dtype="float32", dims=(None, top_k)),
            ColumnSchema(IDS_COLUMN, dtype="int64", dims=(None, top_k)),
        ]
    )
    predict = PredictTorchScriptInExecutor(traced, session_model.input_schema, output_schema)
    predict.max_sequence_length = max_sequence_length
    graph = workflow.input_schema.column_names >> MerlinTransformWorkflow(workflow) >> predict
    ensemble = MerlinEnsemble(graph, workflow.input_schema)
    # The executor unpickles the ensemble in the stub, which cannot import `benchmarks`: ship
    # this module's classes by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ensemble.export(str(repository))
    return ensemble.output_schema.column_names


def trace_top_k(session_model, top_k: int, max_sequence_length: int) -> torch.jit.ScriptModule:
    """The model traced with ``top_k`` set, on a copy: the caller's model is left as it was."""
    model = copy.deepcopy(session_model).eval()
    model.top_k = top_k
    example = {
        name: torch.full((2, max_sequence_length), 3, dtype=torch.int64)
        for name in session_model.input_schema.column_names
    }
    with torch.no_grad():
        return torch.jit.trace(model, (example,), strict=True)
