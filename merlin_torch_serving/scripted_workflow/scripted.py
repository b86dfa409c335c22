"""A fitted workflow's TorchScript form, and running it on numpy arrays in this process.

``ScriptedWorkflow(workflow).transform(columns)`` runs the very module a libtorch step runs, so an
in-process answer is the served answer; it equals ``workflow.transform`` (see ``ordering`` for the
one deliberate difference, the order of clicks whose sort keys tie).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import nvtabular as nvt
import torch

from merlin_torch_serving.exceptions import InputError, WorkflowError
from merlin_torch_serving.fastpath.errors import library_errors
from merlin_torch_serving.scripted_workflow.compiler import compile_nodes
from merlin_torch_serving.scripted_workflow.graph import WorkflowScript
from merlin_torch_serving.scripted_workflow.head import Head
from merlin_torch_serving.scripted_workflow.sessions import LinedUpSessions
from merlin_torch_serving.scripted_workflow.split import split


class ScriptedWorkflow:
    """A fitted NVTabular workflow compiled to TorchScript, node by node.

    ``uncompiled`` lists (operator, reason) for each node without a TorchScript form of its own;
    ``module`` is the whole workflow's (unscripted) module when there is none such. Otherwise, when
    those nodes can run first on the request's rows, ``head`` says which (they run in a python
    step on the fast path) and ``module`` is the rest, reading the columns the head sends beside
    the request's; else ``module`` is None and ``split_problem`` says why. ``non_null_inputs`` are
    request columns in which a null is refused (float columns only: integers hold none).
    """

    def __init__(self, workflow: nvt.Workflow, non_null_inputs: list[str] | tuple[str, ...] = ()):
        if not isinstance(workflow, nvt.Workflow):
            raise TypeError(f"ScriptedWorkflow takes a fitted nvtabular.Workflow, got {workflow!r}")
        with library_errors():
            compiled = compile_nodes(workflow, list(non_null_inputs))
            self.head: Head | None = None
            self.split_problem: str | None = None
            self.uncompiled = compiled.uncompiled
            if compiled.module is None:
                cut = split(workflow, list(non_null_inputs), compiled)
                self.split_problem = cut.problem
                if cut.head is not None and cut.tail is not None and cut.tail.module is not None:
                    self.head, compiled, self.uncompiled = cut.head, cut.tail, cut.reasons
        self.input_schema = workflow.input_schema
        self.output_schema = workflow.output_schema
        self.reduces_over_rows = compiled.reduces_over_rows
        #: the whole workflow's module, or the tail's when a head runs before it
        self.module: WorkflowScript | None = compiled.module
        self._scripted: torch.jit.ScriptModule | None = None
        self._lock = threading.Lock()

    @property
    def complete(self) -> bool:
        """Whether every node of the workflow has a TorchScript form."""
        return self.module is not None and self.head is None

    def scripted(self) -> torch.jit.ScriptModule:
        """The module, scripted once."""
        if self.module is None:
            raise WorkflowError(
                "the workflow has no complete TorchScript form: "
                + "; ".join(f"{label}: {reason}" for label, reason in self.uncompiled)
            )
        with self._lock:
            if self._scripted is None:
                self._scripted = torch.jit.script(self.module)
        return self._scripted

    def transform(self, columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The workflow's output for one request (wire format in and out), run by TorchScript."""
        return run_scripted_arrays(self.scripted(), columns)

    def answer_module(self, key: str, filtered_column: str) -> torch.jit.ScriptModule:
        """The scripted module a libtorch step runs: the workflow's answer with one row per
        request session in first-appearance order (placeholders marked in ``filtered_column``
        for the sessions it drops) when ``key`` names the session key, else as it comes."""
        scripted = self.scripted()  # the module, checked to compile on its own
        if not key or self.module is None:
            return scripted
        return torch.jit.script(LinedUpSessions(self.module, key, filtered_column))

    def exportable(self, key: str, filtered_column: str) -> torch.nn.Module | None:
        """The eager module ``answer_module`` scripts (the whole workflow's, or the tail's after a
        head), for torch.export: the same modules are what a package is compiled from."""
        if self.module is None:
            return None
        if not key:
            return self.module
        return LinedUpSessions(self.module, key, filtered_column)


def run_scripted_arrays(module, columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call a scripted module of wire tensors as libtorch does (inference mode, no optimizing
    executor, which would specialise the graph for every new shape) on numpy arrays; a refused
    input is an ``InputError``."""
    inputs = {
        name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in columns.items()
    }
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        try:
            outputs = module(inputs)
        except torch.jit.Error as error:
            refused = InputError.from_message(str(error).strip().splitlines()[-1])
            if refused is None:
                raise
            raise refused from None
    return {name: tensor.numpy() for name, tensor in outputs.items()}
