"""NOT PART OF MERLIN SYSTEMS. Merlin Systems 23.08's served models (its executor model, and the
model that runs an NVTabular workflow for it) with per-operator timers and, when asked, each node's
result kept for the request: a change made for this benchmark only, to show where Merlin's time
goes. It is never shipped in the library.

merlin-core 23.08's ``LocalExecutor``, which runs both Merlin's served graph and NVTabular's
workflows, keeps no node's result within a call: ``_execute_node`` runs every parent of a node
anew, so a node that several branches read (a workflow's output read by the encoder, the candidate
filter and the session's feature lookup; Categorify's output read by a workflow's Groupby and its
other branches) runs, with everything above it, once per branch that reads it.
``KeptResultsExecutor`` is that executor with one change: a node's result is computed once per
``transform`` call and handed to every node that reads it. Merlin has no setting for this.

The benchmarks copy this file as the ``model.py`` of copies of Merlin's ``executor_model`` and of
its workflow models (``breakdown.add_executor_variant``): a copy runs Merlin's own model, with
``LocalExecutor`` swapped for one of the two below in that stub only, and after every call writes
what the timers hold to the file its config names. Only this file is needed in the stub: it
imports nothing of the benchmarks.
"""

from __future__ import annotations

import json
import os
import time

from merlin.dag.executors import LocalExecutor

#: config parameters of a model copy (see breakdown.add_executor_variant): keep results or not,
#: where to write the timers, which of Merlin's models it runs ("executor" or "workflow"), and for
#: an executor, the workflow model copies to call instead of Merlin's (JSON: name -> copy)
KEEP_RESULTS_PARAMETER = "benchmark_keep_results"
TIMERS_FILE_PARAMETER = "benchmark_timers_file"
MODEL_PARAMETER = "benchmark_model"
WORKFLOW_MODELS_PARAMETER = "benchmark_workflow_models"


#: what the timers call the nodes that only route columns (selections, ``node[...]``, ``+``)
COLUMN_ROUTING = "column routing (selections, +)"


def step_name(node) -> str:
    """What the timers call a node: its operator's label, one name for all column routing."""
    from merlin.dag.ops import ConcatColumns, GroupingOp, SelectionOp, SubsetColumns, SubtractionOp

    if node.op is None or isinstance(
        node.op, (ConcatColumns, GroupingOp, SelectionOp, SubsetColumns, SubtractionOp)
    ):
        return COLUMN_ROUTING
    return node.op.label


class TimedExecutor(LocalExecutor):
    """merlin-core's ``LocalExecutor`` unchanged, timing each operator's ``transform`` (seconds and
    calls per operator label) and each whole ``transform``."""

    def __init__(self):
        super().__init__()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.transform_seconds = 0.0

    def transform(self, transformable, graph, *args, **kwargs):
        started = time.perf_counter()
        try:
            return super().transform(transformable, graph, *args, **kwargs)
        finally:
            self.transform_seconds += time.perf_counter() - started

    def _run_node_transform(self, node, input_data, capture_dtypes=False, strict=False):
        started = time.perf_counter()
        try:
            return super()._run_node_transform(node, input_data, capture_dtypes, strict)
        finally:
            name = step_name(node)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
            self.calls[name] = self.calls.get(name, 0) + 1


class KeptResultsExecutor(TimedExecutor):
    """THE CHANGE, not Merlin's: within one ``transform`` call, each node runs once and its result
    is kept for every node that reads it."""

    def __init__(self):
        super().__init__()
        self._kept: dict[int, object] | None = None

    def transform(self, transformable, graph, *args, **kwargs):
        outer, self._kept = self._kept, {}
        try:
            return super().transform(transformable, graph, *args, **kwargs)
        finally:
            self._kept = outer

    def _execute_node(self, node, transformable, capture_dtypes=False, strict=False):
        kept = self._kept
        if kept is None:
            return super()._execute_node(node, transformable, capture_dtypes, strict)
        if id(node) not in kept:
            kept[id(node)] = super()._execute_node(node, transformable, capture_dtypes, strict)
        return kept[id(node)]


class TritonPythonModel:
    """One of Merlin's served models (its config's ``MODEL_PARAMETER``) run with one of the
    executors above (``KEEP_RESULTS_PARAMETER``), its timers written after every call."""

    def initialize(self, args):
        parameters = {
            key: value.get("string_value")
            for key, value in json.loads(args["model_config"]).get("parameters", {}).items()
        }
        self.timers_file = parameters[TIMERS_FILE_PARAMETER]
        keep = parameters.get(KEEP_RESULTS_PARAMETER) == "true"
        self.executor = KeptResultsExecutor() if keep else TimedExecutor()
        if parameters.get(MODEL_PARAMETER) == "workflow":
            self.merlin = self._workflow_model(args)
        else:
            self.merlin = self._executor_model(
                args, json.loads(parameters.get(WORKFLOW_MODELS_PARAMETER) or "{}")
            )
        self.requests = 0
        self.execute_seconds = 0.0

    def _executor_model(self, args, workflow_models: dict):
        """Merlin's executor model, calling ``workflow_models`` in place of its workflow models."""
        from merlin.dag import postorder_iter_nodes
        from merlin.systems.triton.models import executor_model

        executor = self.executor

        class Runtime(executor_model.TritonExecutorRuntime):
            def __init__(self):
                super().__init__()
                self.executor = executor

        # Merlin's execute makes a TritonExecutorRuntime per request: in this stub, make it ours
        executor_model.TritonExecutorRuntime = Runtime
        model = executor_model.TritonPythonModel()
        model.initialize(args)
        for node in postorder_iter_nodes(model.ensemble.graph.output_node, flatten_subgraphs=True):
            name = getattr(node.op, "nvt_model_name", None)
            if name in workflow_models:
                node.op.set_nvt_model_name(workflow_models[name])
        return model

    def _workflow_model(self, args):
        """Merlin's NVTabular workflow model, its workflow run by our executor."""
        from merlin.systems.triton.models import workflow_model
        from merlin.systems.workflow import base

        executor = self.executor
        # its WorkflowRunner makes a LocalExecutor per call: in this stub, hand it ours
        base.LocalExecutor = lambda *args, **kwargs: executor
        model = workflow_model.TritonPythonModel()
        model.initialize(args)
        return model

    def execute(self, requests):
        started = time.perf_counter()
        responses = self.merlin.execute(requests)
        self.execute_seconds += time.perf_counter() - started
        self.requests += len(requests)
        self._write_timers()
        return responses

    def _write_timers(self) -> None:
        timers = {
            "requests": self.requests,
            "execute_s": self.execute_seconds,
            "transform_s": self.executor.transform_seconds,
            "operators": {
                name: {"seconds": seconds, "calls": self.executor.calls[name]}
                for name, seconds in self.executor.seconds.items()
            },
        }
        partial = f"{self.timers_file}.{os.getpid()}"
        with open(partial, "w") as file:
            json.dump(timers, file)
        os.replace(partial, self.timers_file)
