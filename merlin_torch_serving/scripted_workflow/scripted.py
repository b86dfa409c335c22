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


class ScriptedWorkflow:
    """A fitted NVTabular workflow compiled to TorchScript, node by node.

    ``uncompiled`` lists (operator, reason) for each node without a TorchScript form; ``module``
    is the whole workflow's (unscripted) module when there is none such. ``non_null_inputs`` are
    request columns in which a null is refused (float columns only: integers hold none).
    """

    def __init__(self, workflow: nvt.Workflow, non_null_inputs: list[str] | tuple[str, ...] = ()):
        if not isinstance(workflow, nvt.Workflow):
            raise TypeError(f"ScriptedWorkflow takes a fitted nvtabular.Workflow, got {workflow!r}")
        with library_errors():
            compiled = compile_nodes(workflow, list(non_null_inputs))
        self.input_schema = workflow.input_schema
        self.output_schema = workflow.output_schema
        self.uncompiled = compiled.uncompiled
        self.module: WorkflowScript | None = compiled.module
        self._scripted: torch.jit.ScriptModule | None = None
        self._lock = threading.Lock()

    @property
    def complete(self) -> bool:
        """Whether every node of the workflow has a TorchScript form."""
        return self.module is not None

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
        module = self.scripted()
        inputs = {
            name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in columns.items()
        }
        return {name: tensor.numpy() for name, tensor in run_scripted(module, inputs).items()}


def run_scripted(module, inputs: dict[str, torch.Tensor]):
    """Call a scripted module as libtorch does (inference mode, no optimizing executor, which
    would specialise the graph for every new shape); a refused input is an ``InputError``."""
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        try:
            return module(inputs)
        except torch.jit.Error as error:
            refused = InputError.from_message(str(error).strip().splitlines()[-1])
            if refused is None:
                raise
            raise refused from None
