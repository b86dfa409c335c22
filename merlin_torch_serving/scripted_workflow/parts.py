"""The two operators a ``TransformWorkflow(backend="pytorch")`` runs as when only part of its
workflow has a TorchScript form (``split``): ``WorkflowHead`` on the python backend, the operators
without one on the fast path, then ``WorkflowTail`` on libtorch, the rest in TorchScript reading
the columns the head sends beside the request's. Each is an operator of the plan
(``ServingOperator.parts``), so in-process runs and exports cut the work the same way.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from merlin.schema import Schema
from merlin.table import TensorTable

from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import WorkflowError
from merlin_torch_serving.fastpath.wire_io import output_layout, wire_arrays
from merlin_torch_serving.ops.base import ServingOperator

if TYPE_CHECKING:
    import torch

WORKFLOW_DIR = "workflow"


class WorkflowHead(ServingOperator):
    """Runs ``nodes`` of the fitted ``workflow`` (positions in run order) on the fast path and
    answers ``columns`` (sent name -> [node, column]), one row per request row."""

    def __init__(self, workflow, nodes: list[int], columns: Mapping[str, Sequence], compiled=None):
        """``compiled``: the workflow's fast path, when it is compiled already."""
        super().__init__()
        from merlin_torch_serving.fastpath import compile_workflow
        from merlin_torch_serving.fastpath.compiler import nodes_in_run_order

        self.workflow = workflow
        self.nodes = sorted(int(node) for node in nodes)
        self.columns = {name: (int(node), str(column)) for name, (node, column) in columns.items()}
        self._compiled = compiled or compile_workflow(workflow)
        in_order = nodes_in_run_order(workflow.output_node)
        self._schema = Schema(
            [
                in_order[node].output_schema[column].with_name(name)
                for name, (node, column) in self.columns.items()
            ]
        )
        self._layout = output_layout(self._schema)
        reads = {
            name
            for node in self.nodes
            for name in in_order[node].input_schema.column_names
            + in_order[node].dependency_columns.names
        }
        self._inputs = [name for name in workflow.input_schema.column_names if name in reads]
        #: the operators the head runs, for messages
        self.operators = ", ".join(
            dict.fromkeys(
                in_order[node].op.label
                for node in self.nodes
                if in_order[node].op is not None and in_order[node].parents_with_dependencies
            )
        )

    @property
    def label(self) -> str:
        return f"TransformWorkflow[python: {self.operators}]"

    @property
    def export_name(self) -> str:
        return "transformworkflowhead"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return self.workflow.input_schema.select_by_name(self._inputs)

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return self._schema

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        request = wire.to_wire(transformable)
        rows = len(next(iter(transformable.values())).values) if len(transformable) else 0
        outputs = self._compiled.node_outputs(request, set(self.nodes))
        columns = {}
        for name, (node, column) in self.columns.items():
            batch = outputs[node]
            if batch.num_rows != rows:
                raise WorkflowError(
                    f"operator {self.operators!r} returned {batch.num_rows} rows for a request of"
                    f" {rows}; the part of the workflow before its TorchScript form must keep the"
                    " request's rows: export with TransformWorkflow(..., backend='python')"
                )
            declared = self._schema[name]
            got = batch[column].values.dtype
            want = wire.column_numpy_dtype(declared)
            if rows and got != want:
                raise WorkflowError(
                    f"column {column!r} holds {got} values where its schema says {want}; the part"
                    " of the workflow after it would compute on other values than NVTabular's:"
                    " export with TransformWorkflow(..., backend='python')"
                )
            columns[name] = batch[column]
        from merlin_torch_serving.fastpath.batch import Batch

        arrays = wire_arrays(Batch(columns, rows), self._layout) if rows else _empty(self._layout)
        return wire.from_wire(arrays, self._schema)

    def non_null_inputs(self) -> list[str]:
        return []

    def config(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "columns": {k: list(v) for k, v in self.columns.items()}}

    def save_artifacts(self, artifact_path=None) -> None:
        copy.deepcopy(self.workflow).save(os.path.join(artifact_path, WORKFLOW_DIR))

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        import nvtabular

        return {
            "workflow": nvtabular.Workflow.load(os.path.join(artifact_path, WORKFLOW_DIR)),
            **config,
        }


class Owner(Protocol):
    """What a ``WorkflowTail`` asks of the ``TransformWorkflow`` it is part of."""

    workflow: Any

    def scripted_answer(self, module, transformable: TensorTable) -> TensorTable: ...

    def answer_for_export(self) -> torch.nn.Module | None: ...

    requires_package: bool

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None): ...

    def returned_columns(self) -> list[str]: ...

    def filtered_rows_column(self) -> str | None: ...

    def request_groups(self) -> list[str] | None: ...

    def non_null_inputs(self) -> list[str]: ...

    def warmup_requests(self) -> list[TensorTable]: ...

    def filtered_by(self, request: TensorTable) -> str | None: ...

    def config(self) -> dict[str, Any]: ...

    def placement_notes(self) -> list[str]: ...


class WorkflowTail(ServingOperator):
    """The rest of ``owner``'s workflow in TorchScript, after its ``WorkflowHead``; answers what
    ``owner`` (a ``TransformWorkflow``) answers, one row per request session."""

    backend = "pytorch"

    def __init__(self, owner: Owner, module: torch.nn.Module, inputs: Schema):
        super().__init__()
        self.owner = owner
        self.module = module
        self._inputs = inputs

    @property
    def label(self) -> str:
        return "TransformWorkflow"

    @property
    def export_name(self) -> str:
        return "transformworkflow"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return self._inputs

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        return self.owner.compute_output_schema(self.owner.workflow.input_schema, None)

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        return self.owner.scripted_answer(self.module, transformable)

    def torchscript(self, input_schema: Schema) -> torch.nn.Module:
        return self.module

    def exportable(self, input_schema: Schema) -> torch.nn.Module | None:
        return self.owner.answer_for_export()

    @property
    def requires_package(self) -> bool:  # type: ignore[override]  # the owner's
        return self.owner.requires_package

    def returned_columns(self) -> list[str]:
        return self.owner.returned_columns()

    def filtered_rows_column(self) -> str | None:
        return self.owner.filtered_rows_column()

    def request_groups(self) -> list[str] | None:
        return self.owner.request_groups()

    def non_null_inputs(self) -> list[str]:
        return self.owner.non_null_inputs()

    def warmup_requests(self) -> list[TensorTable]:
        return self.owner.warmup_requests()

    def filtered_by(self, request: TensorTable) -> str | None:
        try:  # the owner's workflow needs every request column; the head kept some
            return self.owner.filtered_by(request)
        except Exception:
            return None

    def config(self) -> dict[str, Any]:
        return self.owner.config()

    def placement_notes(self) -> list[str]:
        return self.owner.placement_notes()


def _empty(layout) -> dict[str, np.ndarray]:
    from merlin_torch_serving.fastpath.wire_io import empty_wire_arrays

    return empty_wire_arrays(layout)
