"""The python-backend side of an exported step: load the step's operators, run them per request.

Every python step's ``model.py`` imports ``TritonPythonModel`` from here. ``HostedStep`` holds
the logic and does not need Triton, so an exported step can also be loaded and run in a test.
Loading checks the step's files against the digests it was exported with; every request is checked
at the step's entry (``validation``) before an operator sees it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving import metrics, wire
from merlin_torch_serving.exceptions import ArtifactError, MerlinTorchServingError
from merlin_torch_serving.executors import torch_threads
from merlin_torch_serving.export.config import (
    MAX_REQUEST_ROWS_PARAMETER,
    METRICS_PARAMETER,
    TORCH_THREADS_PARAMETER,
)
from merlin_torch_serving.export.manifest import library_version, verify_step
from merlin_torch_serving.export.step_metrics import StepMetrics, warmup_runs
from merlin_torch_serving.ops.base import ServingOperator, operator_class
from merlin_torch_serving.plan import OpCall, Ref, run_calls
from merlin_torch_serving.schemas import schema_from_json
from merlin_torch_serving.validation import EntryCheck

STEP_FILE = "step.json"


class HostedStep:
    """The operators of one exported step (``name``), wired as they were in the ensemble's plan."""

    def __init__(
        self, spec: dict, version_dir: str, max_rows: int | None = None, name: str = "step"
    ):
        self.inputs = {name: Ref(*ref) for name, ref in spec["inputs"].items()}
        self.outputs = {name: Ref(*ref) for name, ref in spec["outputs"].items()}
        self.input_schema = schema_from_json(spec["input_schema"])
        self.output_schema = schema_from_json(spec["output_schema"])
        self.calls = []
        for call in spec["calls"]:
            self.calls.append(
                OpCall(
                    index=call["index"],
                    op=_load_operator(name, call, os.path.join(version_dir, call["artifacts"])),
                    inputs={name: Ref(*ref) for name, ref in call["inputs"].items()},
                    input_schema=schema_from_json(call["input_schema"]),
                    output_schema=schema_from_json(call["output_schema"]),
                )
            )
        self.input_specs = wire.schema_specs(self.input_schema)
        self.entry_check = EntryCheck.for_entry(
            self.input_schema, self.inputs, self.calls, max_rows
        )

    @classmethod
    def load(
        cls, version_dir: str, step: str | None = None, max_rows: int | None = None
    ) -> HostedStep:
        """The step exported into ``version_dir``, once its files are checked against step.json."""
        with open(os.path.join(version_dir, STEP_FILE)) as f:
            spec = json.load(f)
        step = step or os.path.basename(os.path.dirname(os.path.abspath(version_dir)))
        verify_step(step, version_dir, spec)
        return cls(spec, version_dir, max_rows, step)

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Wire arrays of the step's inputs in, wire arrays of its outputs out."""
        arrays = {name: wire.bytes_to_text(array) for name, array in arrays.items()}
        self.entry_check.check(arrays)
        table = wire.from_wire(arrays, self.input_schema)
        env = {self.inputs[name]: column for name, column in table.items()}
        results = TensorTable(run_calls(self.calls, env, self.outputs), _unsafe=True)
        metrics.count(
            metrics.SESSIONS, len(next(iter(results.values()))) if results.columns else 0
        )  # rows
        return wire.to_wire(results)


def _load_operator(step: str, call: dict, artifact_path: str) -> ServingOperator:
    """The operator ``call`` describes, if its class reads what was saved.

    ``call`` is an entry of step.json.
    """
    cls = operator_class(call["class"])
    saved = call.get("format_version")
    if saved != cls.format_version:
        raise ArtifactError(
            step,
            f"its operator {call['label']} was saved in format {saved} of {call['class']}, and that"
            f" class reads format {cls.format_version}",
            f"re-export the ensemble with merlin-torch-serving {library_version()}",
        )
    return cls.load(call["config"], artifact_path)


class TritonPythonModel:
    """Triton's python-backend entry point for a step exported by this library."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        self.model_name = args["model_name"]
        # what the operators log while loading (how a model runs, what the fast path leaves to
        # NVTabular) goes to the server's log, under this model's name
        library_logger = logging.getLogger("merlin_torch_serving")
        library_logger.addHandler(_TritonLogHandler(pb_utils.Logger, self.model_name))
        library_logger.setLevel(logging.INFO)
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        max_rows = parameters.get(MAX_REQUEST_ROWS_PARAMETER, {}).get("string_value")
        self.step = HostedStep.load(
            version_dir, self.model_name, int(max_rows) if max_rows else None
        )
        self.output_names = [output["name"] for output in config["output"]]
        # python backends before 23.05 have no metrics API: serve without the step's own metrics
        publish = parameters.get(METRICS_PARAMETER, {}).get("string_value") != "false"
        publish = publish and hasattr(pb_utils, "MetricFamily")
        self.metrics = (
            StepMetrics(pb_utils, self.model_name, warmup_runs(config)) if publish else None
        )
        threads = parameters.get(TORCH_THREADS_PARAMETER, {}).get("string_value")
        # applied around each call: the thread count is per calling thread in torch's OpenMP build
        self.torch_threads = int(threads) if threads else None

    def execute(self, requests):
        pb = self._pb
        responses = []
        for request in requests:
            try:
                arrays = {
                    spec.name: pb.get_input_tensor_by_name(request, spec.name).as_numpy()
                    for spec in self.step.input_specs
                }
                outputs = self._run(arrays)
                tensors = [
                    pb.Tensor(name, wire.text_to_bytes(outputs[name])) for name in self.output_names
                ]
                responses.append(pb.InferenceResponse(output_tensors=tensors))
            except Exception as exc:  # one failing request must not fail the others
                if self.metrics is not None:
                    self.metrics.skip_warmup()
                detail = (
                    str(exc)
                    if isinstance(exc, MerlinTorchServingError)
                    else f"{type(exc).__name__}: {exc}"
                )
                message = f"model {self.model_name!r}: {detail}"
                responses.append(
                    pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message))
                )
        return responses

    def finalize(self):
        step_metrics = getattr(self, "metrics", None)  # None also when initialize failed early
        if step_metrics is not None:
            step_metrics.close()

    def _run(self, arrays: dict) -> dict:
        with torch_threads(self.torch_threads):
            if self.metrics is None:
                return self.step.run(arrays)
            with metrics.collecting() as collected:
                outputs = self.step.run(arrays)
            self.metrics.publish(collected)
            return outputs


class _TritonLogHandler(logging.Handler):
    """Forwards the library's log records to Triton's log (``pb_utils.Logger``)."""

    def __init__(self, triton_logger, model_name: str):
        super().__init__()
        self.triton_logger = triton_logger
        self.model_name = model_name

    def emit(self, record: logging.LogRecord) -> None:
        message = f"model {self.model_name!r}: {record.getMessage()}"
        if record.levelno >= logging.ERROR:
            self.triton_logger.log_error(message)
        elif record.levelno >= logging.WARNING:
            self.triton_logger.log_warn(message)
        else:
            self.triton_logger.log_info(message)
