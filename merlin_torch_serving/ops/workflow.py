"""TransformWorkflow: run a fitted NVTabular workflow on raw interaction rows.

By default the workflow runs through the compiled fast path (``merlin_torch_serving.fastpath``):
numpy kernels built once per operator instance, equal to ``workflow.transform`` but without a
DataFrame per request. The same path runs in-process and inside the served model, so both give
the same answer. On every path (fast, NVTabular's, TorchScript) a session's clicks that share a
timestamp keep the request's order, so its answer depends on its own clicks only, whatever other
sessions share the request (NVTabular's own sort leaves ties in an order that depends on them).
When the workflow groups rows into sessions, the answer has one row per session of the request, in
the order sessions first appear, including the sessions its filters drop (see ``session_rows``);
the session id and that mark come back with every answer.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from merlin.dag import postorder_iter_nodes
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.table import TensorTable

from merlin_torch_serving.aot.choice import compiled_choice
from merlin_torch_serving.data import wire
from merlin_torch_serving.exceptions import SchemaError, WorkflowNotFittedError
from merlin_torch_serving.graph import metrics
from merlin_torch_serving.ops import warmup_sessions
from merlin_torch_serving.ops.base import ServingOperator
from merlin_torch_serving.ops.session_rows import FILTERED_COLUMN, line_up_sessions
from merlin_torch_serving.ops.unfiltered import unfiltered_rows, without_filters

if TYPE_CHECKING:
    import torch

    from merlin_torch_serving.fastpath import CompiledWorkflow

WORKFLOW_DIR = "workflow"
logger = logging.getLogger("merlin_torch_serving")
FILTERED_SESSIONS = ("empty", "unfiltered")


class TransformWorkflow(ServingOperator):
    """Apply ``workflow`` (fitted ``nvtabular.Workflow``) to the request.

    Parameters
    ----------
    workflow
        The fitted workflow; its input schema is what this operator expects.
    keep_request_order
        When the workflow groups rows by one key column that it also outputs (session-based
        workflows group by session id), answer one row per session of the request, in the order
        sessions first appear, and a placeholder row, marked True in ``filtered_out``, for each
        session the workflow's filters drop. ``False`` takes the workflow's rows as they come
        (sorted by key, filtered sessions left out).
    fast_path
        Run the workflow through compiled numpy kernels (operators without one run through
        NVTabular, logged once each). ``False`` runs every operator through NVTabular's own
        transform, one step at a time.
    return_session_id
        Every answer of an ensemble built on this operator carries the session key column
        (when there is one), whether or not the graph selects it.
    backend
        ``"python"`` runs the workflow in a python-backend step (the fast path). ``"pytorch"`` runs
        its TorchScript form (``merlin_torch_serving.scripted_workflow``) on Triton's pytorch
        backend, where the model, top-k and decoding that follow it are compiled into the same
        libtorch model: raw clicks in, recommendations out, no python in the serving path.
        In-process runs use the same TorchScript. A workflow with an operator that has no
        TorchScript form runs on the python backend instead, and the export says which and why.
    compiled
        With ``backend="pytorch"``: what the libtorch step is, as ``PredictPytorch``'s
        ``compiled`` says (``"auto"``: an AOTInductor package of the workflow and what is compiled
        into its step where torch.export takes them, else TorchScript; ``"package"``;
        ``"torchscript"``; ``None``: ``$MTS_COMPILED``, "auto" when unset).
    filtered_sessions
        What the placeholder row of a session the filters drop holds: ``"empty"`` (empty lists
        and zeros; every result computed from it is blanked anyway) or ``"unfiltered"`` (its
        features as if no ``Filter`` had dropped it, computed from its clicks: what a route's
        fallback recommends from, see ``ops.unfiltered``; the python backend only).
    """

    def __init__(
        self,
        workflow,
        *,
        keep_request_order: bool = True,
        fast_path: bool = True,
        return_session_id: bool = True,
        backend: Literal["python", "pytorch"] = "python",
        filtered_sessions: str = "empty",
        compiled: Literal["auto", "package", "torchscript"] | None = None,
    ):
        super().__init__()
        if backend not in ("python", "pytorch"):
            raise ValueError(f"backend must be 'python' or 'pytorch', got {backend!r}")
        chosen = compiled_choice(compiled)
        self.compiled = chosen
        self.requires_package = backend == "pytorch" and chosen == "package"
        _check_fitted(workflow)
        if filtered_sessions not in FILTERED_SESSIONS:
            raise ValueError(
                f"filtered_sessions must be one of {FILTERED_SESSIONS}, got {filtered_sessions!r}"
            )
        self.filtered_sessions = filtered_sessions
        self.workflow = workflow
        self.keep_request_order = keep_request_order
        self.fast_path = fast_path
        self.return_session_id = return_session_id
        self.session_key = _groupby_key(workflow) if keep_request_order else None
        self.filtered_column = (
            FILTERED_COLUMN if self.session_key and _may_drop_rows(workflow) else None
        )
        if self.filtered_column in workflow.output_schema.column_names:
            raise SchemaError(
                self.label,
                self.filtered_column,
                "a column name free for marking the sessions the workflow filters out",
                "a workflow output of that name",
                "rename that output, or pass keep_request_order=False",
            )
        # compiled here, where it reads the vocabularies and logs what it leaves to NVTabular: in a
        # served model that is while the model loads, not on its first request
        from merlin_torch_serving.fastpath import compile_workflow

        self._compiled = compile_workflow(workflow, kernels=fast_path)
        self._unfiltered = (
            compile_workflow(without_filters(workflow), kernels=fast_path)
            if self.filtered_column and filtered_sessions == "unfiltered"
            else None
        )
        self.backend_choice = backend
        self._placement_notes: list[str] = []
        self._scripted_answer: torch.nn.Module | None = None
        self._exportable: torch.nn.Module | None = None
        self._parts: list[ServingOperator] = []
        self._reduces_over_rows = False
        if backend == "pytorch":
            self._script()

    def _script(self) -> None:
        """The workflow's TorchScript form, or the python backend and why."""
        from merlin_torch_serving.scripted_workflow import ScriptedWorkflow

        if self._unfiltered is not None:
            self.backend_choice = "python"
            self._placement_notes = [
                "TransformWorkflow runs on the python backend, not libtorch:"
                " filtered_sessions='unfiltered' computes the features of the sessions its filters"
                " drop on the fast path, which has no TorchScript form"
            ]
            logger.warning(self._placement_notes[0])
            return
        scripted = ScriptedWorkflow(self.workflow, self.non_null_inputs())
        self._exportable = scripted.exportable(self.session_key or "", self.filtered_column or "")
        self._reduces_over_rows = bool(scripted.reduces_over_rows)
        reasons = "; ".join(f"{label}: {reason}" for label, reason in scripted.uncompiled)
        self._answer_schema = self.compute_output_schema(self.workflow.input_schema, None)
        if scripted.module is not None:
            self._scripted_answer = scripted.answer_module(
                self.session_key or "", self.filtered_column or ""
            )
        if scripted.complete:
            return
        if scripted.head is not None and self._scripted_answer is not None:
            from merlin_torch_serving.scripted_workflow.parts import WorkflowHead, WorkflowTail

            head = scripted.head
            head_part = WorkflowHead(
                self.workflow, sorted(head.nodes), head.columns, self._compiled
            )
            sent = head.output_schema()
            tail_inputs = Schema(
                [c for c in self.workflow.input_schema if wire.is_carried_by_tensors(c)]
                + list(sent)
            )
            self._parts = [head_part, WorkflowTail(self, self._scripted_answer, tail_inputs)]
            note = (
                f"TransformWorkflow runs {head_part.operators} in a python step"
                f" before the rest of the workflow in TorchScript: {reasons}"
            )
        else:
            self.backend_choice = "python"
            self._scripted_answer = None
            note = (
                "TransformWorkflow runs on the python backend, not libtorch: operators without a"
                f" TorchScript form: {reasons}; {scripted.split_problem}"
            )
        self._placement_notes = [note]
        logger.warning(note)

    def parts(self) -> list[ServingOperator]:
        return self._parts or [self]

    # `backend` is what the exporter reads; it is per instance here
    @property
    def backend(self) -> str:  # type: ignore[override]
        return self.backend_choice

    def placement_notes(self) -> list[str]:
        return list(self._placement_notes)

    def torchscript(self, input_schema: Schema) -> torch.nn.Module | None:
        """The scripted workflow, answering one row per request session (libtorch only)."""
        return self._scripted_answer if self.backend_choice == "pytorch" else None

    def exportable(self, input_schema: Schema) -> torch.nn.Module | None:
        """The same modules eager, for an AOTInductor package (a whole workflow in libtorch; a
        workflow split in two runs as its parts)."""
        return None if self._parts else self.answer_for_export()

    def answer_for_export(self) -> torch.nn.Module | None:
        """The eager form of what ``torchscript`` gives (the tail's after a python head), unless
        ``compiled="torchscript"``."""
        if self.backend_choice != "pytorch" or self.compiled == "torchscript":
            return None
        return self._exportable

    def compiled_workflow(self) -> CompiledWorkflow:
        """The workflow compiled for the fast path.

        Without the fast path, it runs step by step through NVTabular.
        """
        return self._compiled

    @property
    def label(self) -> str:
        return "TransformWorkflow"

    def expected_input_schema(self, input_schema: Schema) -> Schema:
        return self.workflow.input_schema

    def root_columns(self) -> list[str]:
        return self.workflow.input_schema.column_names

    def compute_output_schema(self, input_schema, col_selector, prev_output_schema=None) -> Schema:
        schema = self.workflow.output_schema
        if self.filtered_column is None:
            return schema
        # placeholder rows hold empty lists
        columns = [_allowing_empty_lists(column) for column in schema]
        return Schema(columns + [ColumnSchema(self.filtered_column, dtype="bool", dims=(None,))])

    def returned_columns(self) -> list[str]:
        columns = [self.session_key] if self.session_key and self.return_session_id else []
        return columns + ([self.filtered_column] if self.filtered_column else [])

    def filtered_rows_column(self) -> str | None:
        return self.filtered_column

    def warmup_requests(self) -> list[TensorTable]:
        """One session (when the workflow groups by a key) of several lengths, long sessions for
        count filters, with known vocabulary values and, failing value filters, constant numbers."""
        return warmup_sessions.session_requests(self.workflow, self.session_key)

    def filtered_by(self, request: TensorTable) -> str | None:
        return self.compiled_workflow().emptying_node(wire.to_wire(request))

    def request_groups(self) -> list[str] | None:
        """The keys of the workflow's Groupby when they are request columns (the session id): the
        other operators of a fitted workflow transform rows independently, unless a function reads
        a whole column (``col - col.min()``), which its TorchScript form tells: then no split of
        a request is safe."""
        if self._reduces_over_rows:
            return None
        return _groupby_columns(self.workflow)

    def non_null_inputs(self) -> list[str]:
        """The Groupby keys (a null key would drop its rows from the answer) and the raw columns of
        outputs tagged as ids (a null item id is a broken click, not a category of its own)."""
        ids = [c.name for c in self.workflow.output_schema if Tags.ID in c.tags]
        sources = {
            name for column in ids for name in _input_sources(self.workflow.output_node, column)
        }
        keys = _groupby_columns(self.workflow) or []
        inputs = self.workflow.input_schema.column_names
        return [name for name in inputs if name in sources or name in keys]

    def transform(self, col_selector, transformable: TensorTable) -> TensorTable:
        if self.backend_choice == "pytorch":
            return self._scripted_transform(transformable)
        arrays = self.compiled_workflow().transform(wire.to_wire(transformable))
        table = wire.from_wire(arrays, self.workflow.output_schema)
        if self.session_key is None:
            return table
        key = self.session_key
        unfiltered = self._unfiltered
        answer = line_up_sessions(
            table,
            transformable[key].values,
            key,
            self.filtered_column,
            (lambda keys: unfiltered_rows(unfiltered, transformable, key, keys))
            if unfiltered is not None
            else None,
        )
        if self.filtered_column:
            metrics.count(
                metrics.FILTERED_SESSIONS, np.count_nonzero(answer[self.filtered_column].values)
            )
        return answer

    def _scripted_transform(self, transformable: TensorTable) -> TensorTable:
        return self.scripted_answer(self._scripted_answer, transformable)

    def scripted_answer(self, module, transformable: TensorTable) -> TensorTable:
        """``module``, the TorchScript a libtorch step runs, run here: the served answer, bit for
        bit."""
        from merlin_torch_serving.scripted_workflow.scripted import run_scripted_arrays

        arrays = run_scripted_arrays(module, wire.to_wire(transformable))
        table = wire.from_wire(arrays, self._answer_schema)
        if self.filtered_column:
            metrics.count(
                metrics.FILTERED_SESSIONS, np.count_nonzero(table[self.filtered_column].values)
            )
        return table

    def config(self) -> dict[str, Any]:
        return {
            "keep_request_order": self.keep_request_order,
            "fast_path": self.fast_path,
            "return_session_id": self.return_session_id,
            "filtered_sessions": self.filtered_sessions,
            "compiled": self.compiled,
        }

    def save_artifacts(self, artifact_path=None) -> None:
        # Workflow.save repoints the statistics of the workflow it saves to the new folder;
        # save a copy so that exporting never changes this operator
        copy.deepcopy(self.workflow).save(os.path.join(artifact_path, WORKFLOW_DIR))

    @classmethod
    def load_arguments(cls, config: dict[str, Any], artifact_path: str) -> dict[str, Any]:
        import nvtabular

        return {
            "workflow": nvtabular.Workflow.load(os.path.join(artifact_path, WORKFLOW_DIR)),
            **config,
        }


def _check_fitted(workflow) -> None:
    """A WorkflowNotFittedError naming the operators without statistics (NVTabular itself fails
    later, with a missing column or a None vocabulary)."""
    from merlin.dag.ops.stat_operator import StatOperator

    unfitted = [
        node.op.label
        for node in postorder_iter_nodes(workflow.output_node)
        if isinstance(node.op, StatOperator) and not node.op.fitted
    ]
    if unfitted or workflow.output_schema is None:
        raise WorkflowNotFittedError(list(dict.fromkeys(unfitted)))


def _groupby_key(workflow) -> str | None:
    """The single key column of the workflow's only Groupby, if it is both input and output."""
    from nvtabular.ops import Groupby

    groupbys = [
        n.op for n in postorder_iter_nodes(workflow.output_node) if isinstance(n.op, Groupby)
    ]
    if len(groupbys) != 1 or len(groupbys[0].groupby_cols) != 1:
        return None
    key = groupbys[0].groupby_cols[0]
    if key in workflow.input_schema.column_names and key in workflow.output_schema.column_names:
        return key
    return None


def _groupby_columns(workflow) -> list[str] | None:
    """The key columns shared by every Groupby of the workflow ([] without one; None when the
    Groupbys differ or group by a column the request does not carry)."""
    from nvtabular.ops import Groupby

    keys = {
        tuple(n.op.groupby_cols)
        for n in postorder_iter_nodes(workflow.output_node)
        if isinstance(n.op, Groupby)
    }
    if not keys:
        return []
    if len(keys) > 1 or not set(next(iter(keys))) <= set(workflow.input_schema.column_names):
        return None
    return list(next(iter(keys)))


def derived_columns(workflow, raw_column: str) -> list[str]:
    """The workflow's output columns computed from the request column ``raw_column``."""
    return [
        name
        for name in workflow.output_schema.column_names
        if raw_column in _input_sources(workflow.output_node, name)
    ]


def _input_sources(node, column: str) -> set[str]:
    """The workflow input columns ``column`` of ``node`` is computed from."""
    parents = node.parents_with_dependencies
    if not parents:
        return {column}
    sources = set()
    for name in node.column_mapping.get(column, [column]):
        for parent in parents:
            if name in parent.output_schema.column_names:
                sources |= _input_sources(parent, name)
    return sources


def _may_drop_rows(workflow) -> bool:
    """Whether an operator of the workflow can leave sessions out: a Filter, a Dropna, or an
    operator NVTabular does not ship (its transform may drop rows too)."""
    from nvtabular.ops import Dropna, Filter

    for node in postorder_iter_nodes(workflow.output_node):
        op = node.op
        if op is None:
            continue
        module = type(op).__module__
        if isinstance(op, (Filter, Dropna)) or not module.startswith(("nvtabular.", "merlin.")):
            return True
    return False


def _allowing_empty_lists(column: ColumnSchema) -> ColumnSchema:
    dims = column.shape.dims
    if not wire.is_ragged(column) or dims[1].min in (None, 0):
        return column
    return column.with_shape((None, (0, dims[1].max)))
