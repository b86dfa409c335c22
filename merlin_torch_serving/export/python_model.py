"""The python-backend side of an exported step: load the step's operators, run them per request.

Every python step's ``model.py`` imports ``TritonPythonModel`` from here. ``HostedStep`` holds
the logic and does not need Triton, so an exported step can also be loaded and run in a test.
Loading checks the step's files against the digests it was exported with; every request is checked
at the step's entry (``validation``) before an operator sees it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np
from merlin.table import TensorTable

from merlin_torch_serving.data import tables, wire
from merlin_torch_serving.data.schemas import schema_from_json
from merlin_torch_serving.exceptions import ArtifactError, InputError, MerlinTorchServingError
from merlin_torch_serving.export import heap, merging
from merlin_torch_serving.export.config import (
    CONFIG_OVERRIDES_FILE,
    DEFAULT_MAX_BATCH_ROWS,
    MAX_BATCH_ROWS_PARAMETER,
    MAX_REQUEST_ROWS_PARAMETER,
    METRICS_PARAMETER,
    PADDED_SUFFIX,
    ROWS_TENSOR,
    TORCH_THREADS_PARAMETER,
    WARMUP_PARAMETER,
)
from merlin_torch_serving.export.manifest import library_version, verify_step
from merlin_torch_serving.export.overrides import read_config_overrides
from merlin_torch_serving.export.step_metrics import StepMetrics, is_warmup_request, warmup_runs
from merlin_torch_serving.export.warmup_files import WARMUP_DIR, read_warmup_files
from merlin_torch_serving.graph import answering, metrics
from merlin_torch_serving.graph.plan import OpCall, Ref, run_calls
from merlin_torch_serving.graph.rehearsal import rehearsing
from merlin_torch_serving.graph.threads import torch_threads
from merlin_torch_serving.graph.validation import EntryCheck
from merlin_torch_serving.ops.base import ServingOperator, operator_class

STEP_FILE = "step.json"


class HostedStep:
    """The operators of one exported step (``name``), wired as they were in the ensemble's plan."""

    def __init__(
        self,
        spec: dict,
        version_dir: str,
        max_rows: int | None = None,
        name: str = "step",
        max_batch_rows: int | None = None,
        overrides: dict | None = None,
    ):
        """``overrides``: by call index (a string), ``config()`` keys its operator takes from the
        model's folder instead (``CONFIG_OVERRIDES_FILE``)."""
        overrides = overrides or {}
        #: the ensemble the step belongs to, and the version it was exported as (empty and 0 for a
        #: step exported before they were recorded)
        ensemble = spec.get("ensemble") or {}
        self.ensemble, self.ensemble_version = ensemble.get("name", ""), ensemble.get("version", 0)
        self.inputs = {name: Ref(*ref) for name, ref in spec["inputs"].items()}
        self.outputs = {name: Ref(*ref) for name, ref in spec["outputs"].items()}
        self.input_schema = schema_from_json(spec["input_schema"])
        self.output_schema = schema_from_json(spec["output_schema"])
        self.calls = []
        for call in spec["calls"]:
            self.calls.append(
                OpCall(
                    index=call["index"],
                    op=_load_operator(
                        name,
                        call,
                        os.path.join(version_dir, call["artifacts"]),
                        overrides.get(str(call["index"]), {}),
                    ),
                    inputs={name: Ref(*ref) for name, ref in call["inputs"].items()},
                    input_schema=schema_from_json(call["input_schema"]),
                    output_schema=schema_from_json(call["output_schema"]),
                )
            )
        self.input_specs = wire.schema_specs(self.input_schema)
        self.entry_check = EntryCheck.for_entry(
            self.input_schema, self.inputs, self.calls, max_rows
        )
        self.max_batch_rows = max_batch_rows or max_rows or DEFAULT_MAX_BATCH_ROWS
        self.merge_keys = self._merge_keys()

    @classmethod
    def load(
        cls,
        version_dir: str,
        step: str | None = None,
        max_rows: int | None = None,
        max_batch_rows: int | None = None,
        overrides: dict | None = None,
    ) -> HostedStep:
        """The step exported into ``version_dir``, once its files are checked against step.json."""
        with open(os.path.join(version_dir, STEP_FILE)) as f:
            spec = json.load(f)
        step = step or os.path.basename(os.path.dirname(os.path.abspath(version_dir)))
        verify_step(step, version_dir, spec)
        return cls(spec, version_dir, max_rows, step, max_batch_rows, overrides)

    def run(
        self, arrays: Mapping[str, np.ndarray], whom: answering.Answering | None = None
    ) -> dict[str, np.ndarray]:
        """Wire arrays of the step's inputs in, wire arrays of its outputs out; ``whom``: what the
        run answers (``graph.answering``), for the operators that record it."""
        with answering.answering(whom):
            return self._answer(self._entry(arrays))

    def run_batch(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        whom: answering.Answering | None = None,
    ) -> list[dict[str, np.ndarray] | Exception]:
        """Per request, its answer (wire arrays) or the error it alone gets: requests are checked
        one by one, then answered in merged runs (see ``merging``); ``whom``: what the batch
        answers, one request id per request."""
        answers: dict[int, dict[str, np.ndarray] | Exception] = {}
        checked: dict[int, dict[str, np.ndarray]] = {}
        for index, arrays in enumerate(requests):
            try:
                checked[index] = self._entry(arrays)
            except Exception as error:  # a bad request fails alone
                answers[index] = error
        indices = list(checked)

        def around(run: list[int], rows: list[int]):
            if whom is None:
                return contextlib.nullcontext()
            return answering.answering(whom.for_requests([indices[i] for i in run], rows))

        parts = merging.answer_in_runs(
            [checked[index] for index in indices],
            self._answer,
            self.merge_keys,
            self.max_batch_rows,
            around,
        )
        answers.update(zip(indices, parts, strict=True))
        return [answers[index] for index in range(len(requests))]

    def close(self) -> None:
        """Stop what the step's operators run beside requests (an answer log's writer), once
        their work is done."""
        for call in self.calls:
            call.op.close()

    def _entry(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The request's wire arrays (text as ``str``), once they are checked."""
        arrays = {name: wire.bytes_to_text(array) for name, array in arrays.items()}
        self.entry_check.check(arrays)
        return arrays

    def _answer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        table = wire.from_wire(arrays, self.input_schema)
        env = {self.inputs[name]: column for name, column in table.items()}
        labelled = metrics.counted(metrics.SESSIONS)
        results = TensorTable(run_calls(self.calls, env, self.outputs), _unsafe=True)
        # rows; those an operator counted itself (a route's, per branch) are not counted twice
        labelled = metrics.counted(metrics.SESSIONS) - labelled
        metrics.count(metrics.SESSIONS, tables.num_rows(results) - labelled)
        return wire.to_wire(results)

    def _merge_keys(self) -> list[str] | None:
        """The step's input columns that group rows (the session id), ``[]`` when rows stand alone,
        None when requests must not be merged (an operator groups by a column made in the step)."""
        name_of = {ref: name for name, ref in self.inputs.items()}
        found: list[str] = []
        for call in self.calls:
            keys = call.op.request_groups()
            if keys is None:
                return None
            names: list[str] = []
            for key in keys:
                ref = call.inputs.get(key)
                name = name_of.get(ref) if ref is not None else None
                if name is None or wire.is_ragged(self.input_schema[name]):
                    return None
                names.append(name)
            if names and found and names != found:
                return None
            found = names or found
        return found


def _load_operator(
    step: str, call: dict, artifact_path: str, overrides: dict | None = None
) -> ServingOperator:
    """The operator ``call`` describes, if its class reads what was saved.

    ``call`` is an entry of step.json; ``overrides`` replace keys of its config that the class
    lets a model's config change (``reloadable_config``).
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
    overrides = overrides or {}
    refused = sorted(key for key in overrides if key not in cls.reloadable_config)
    if refused:
        allowed = ", ".join(map(repr, cls.reloadable_config)) or "none"
        raise ArtifactError(
            step,
            f"its {CONFIG_OVERRIDES_FILE} overrides {refused} of operator {call['label']}, and"
            f" that operator lets it override only {allowed}",
            "remove them from the file, or re-export the ensemble with the new settings",
        )
    return cls.load({**call["config"], **overrides}, artifact_path)


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
        batch_rows = parameters.get(MAX_BATCH_ROWS_PARAMETER, {}).get("string_value")
        self.step = HostedStep.load(
            version_dir,
            self.model_name,
            int(max_rows) if max_rows else None,
            int(batch_rows) if batch_rows else None,
            read_config_overrides(args["model_repository"], self.model_name),
        )
        self.output_names = [output["name"] for output in config["output"]]
        # batched: Triton hands execute several requests, each tensor with a leading dimension of 1
        self.batched = int(config.get("max_batch_size", 0)) > 0
        # python backends before 23.05 have no metrics API: serve without the step's own metrics
        publish = parameters.get(METRICS_PARAMETER, {}).get("string_value") != "false"
        publish = publish and hasattr(pb_utils, "MetricFamily")
        self.metrics = (
            StepMetrics(pb_utils, self.model_name, warmup_runs(config)) if publish else None
        )
        # Triton's model_warmup requests come first, one per execute: they rehearse (store nothing)
        self.warmup_left = warmup_runs(config)
        self._served = answering.Answering(
            answering.SERVED,
            ensemble=self.step.ensemble,
            ensemble_version=self.step.ensemble_version,
            model=self.model_name,
            version=int(args["model_version"]),
        )
        threads = parameters.get(TORCH_THREADS_PARAMETER, {}).get("string_value")
        # applied around each call: the thread count is per calling thread in torch's OpenMP build
        self.torch_threads = int(threads) if threads else None
        warmup = parameters.get(WARMUP_PARAMETER, {}).get("string_value")
        if warmup:
            self._warm_up(json.loads(warmup), os.path.join(args["model_repository"], WARMUP_DIR))

    def execute(self, requests):
        items: list[dict[str, np.ndarray] | Exception] = []
        for request in requests:
            try:
                items.append(self._request_arrays(request))
            except Exception as error:  # answered as that request's error below
                items.append(error)
        good = [i for i, item in enumerate(items) if not isinstance(item, Exception)]
        batch = [item for item in items if not isinstance(item, Exception)]
        # the launcher's warm-up through the whole ensemble (launcher.warmup) rehearses and is
        # left out of the counts, as Triton's own warm-up is (see step_metrics)
        traffic = not all(is_warmup_request(request) for request in requests)
        warming_up, self.warmup_left = self.warmup_left > 0, max(self.warmup_left - len(items), 0)
        whom = self._whom([requests[i] for i in good])
        with rehearsing(warming_up or not traffic):
            answers = self._run(batch, whom, traffic)
        for i, answer in zip(good, answers, strict=True):
            items[i] = answer
        if self.metrics is not None and traffic:
            for _ in range(sum(isinstance(item, Exception) for item in items)):
                self.metrics.skip_warmup()  # a failed warm-up request is one of them all the same
        responses = [
            self._response(item, self._requested(request))
            for item, request in zip(items, requests, strict=True)
        ]
        heap.release_after(heap.rows(batch))
        return responses

    def finalize(self):
        step = getattr(self, "step", None)  # None when initialize failed early
        if step is not None:
            step.close()
        step_metrics = getattr(self, "metrics", None)
        if step_metrics is not None:
            step_metrics.close()

    def _whom(self, requests: list) -> answering.Answering:
        """What a batch of ``requests`` answers: the requests of these ids, by this model."""
        ids = tuple(request.request_id() for request in requests)
        return dataclasses.replace(self._served, request_ids=ids)

    def _run(self, batch: list[dict], whom: answering.Answering, counted: bool = True) -> list:
        """Per request, its answer or its error: merged when Triton batches the step; what they
        counted is published when ``counted``."""
        counting = metrics.collecting() if self.metrics is not None else contextlib.nullcontext()
        with torch_threads(self.torch_threads), counting as collected:
            answers = (
                self.step.run_batch(batch, whom)
                if self.batched
                else [
                    merging.answer_or_error(
                        functools.partial(self.step.run, whom=whom.for_requests([i], [])), arrays
                    )
                    for i, arrays in enumerate(batch)
                ]
            )
        answered = sum(not isinstance(answer, Exception) for answer in answers)
        if self.metrics is not None and collected is not None and answered and counted:
            self.metrics.publish(collected, answered)
        return answers

    def _request_arrays(self, request) -> dict[str, np.ndarray]:
        arrays = {}
        for spec in self.step.input_specs:
            tensor = self._pb.get_input_tensor_by_name(request, spec.name)
            if tensor is None:
                raise InputError(spec.name, "a tensor of that name", "no such tensor")
            array = tensor.as_numpy()
            if self.batched:
                if array.ndim == 0 or array.shape[0] != 1:
                    raise InputError(
                        spec.name,
                        "a leading dimension of 1 (this ensemble batches requests: each tensor is "
                        "[1, ...])",
                        f"shape {list(array.shape)}",
                        "send one request per batch item; Client does",
                    )
                array = array[0]
            arrays[spec.name] = array
        return arrays

    def _requested(self, request) -> list[str]:
        """The outputs the ensemble reads of this step (a batched libtorch step's feeder answers
        some only padded), in config order; all of them where the backend cannot say."""
        asked = getattr(request, "requested_output_names", None)
        if asked is None:
            return self.output_names
        names = set(asked())
        return [name for name in self.output_names if name in names]

    def _response(self, answer, names: list[str]):
        pb = self._pb
        if isinstance(answer, Exception):
            detail = (
                str(answer)
                if isinstance(answer, MerlinTorchServingError)
                else f"{type(answer).__name__}: {answer}"
            )
            message = f"model {self.model_name!r}: {detail}"
            return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message))
        tensors = []
        for name in names:
            # what a batched libtorch step this one feeds reads (see libtorch_batching.py)
            if name == ROWS_TENSOR:
                array = np.zeros(merging.rows(answer), dtype=np.uint8)
            elif name.endswith(PADDED_SUFFIX):
                array = merging.padded(answer[name[: -len(PADDED_SUFFIX)]])
            else:
                array = wire.text_to_bytes(answer[name])
            tensors.append(pb.Tensor(name, array[np.newaxis] if self.batched else array))
        return pb.InferenceResponse(output_tensors=tensors)

    def _warm_up(self, warmup: dict, folder: str) -> None:
        """Run the exported warm-up sample alone and merged with copies of itself under other
        session keys (runs of 1, 2 and 8 requests), so the first requests find every code path
        and the shapes of small batches already used. What they count is dropped."""
        sample = read_warmup_files(folder, warmup["inputs"])
        batches = [
            [sample],
            *([renamed_copy(sample, self.step.merge_keys, i) for i in range(n)] for n in (2, 8)),
        ]
        # collecting, as served requests are, so that the operators' counting paths warm up too
        with torch_threads(self.torch_threads), metrics.collecting(), rehearsing():
            for _ in range(int(warmup["count"])):
                for batch in batches:
                    ids = tuple("" for _ in batch)
                    self.step.run_batch(batch, dataclasses.replace(self._served, request_ids=ids))


def renamed_copy(
    sample: dict[str, np.ndarray], keys: list[str] | None, index: int
) -> dict[str, np.ndarray]:
    """The sample with its key values (session ids) made distinct for each ``index``, so that
    copies merge into one run."""
    copy = dict(sample)
    for key in keys or []:
        values = sample[key]
        if values.dtype.kind in "iu":
            copy[key] = values + index * (
                int(values.max(initial=0)) - int(values.min(initial=0)) + 1
            )
        else:
            copy[key] = np.array([f"{v}~{index}" for v in values], dtype=object)
    return copy


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
