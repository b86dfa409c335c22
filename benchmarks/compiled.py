"""The libtorch step compiled ahead of time against TorchScript, in this process: one forward of the
mixed export's libtorch step (the model with its TopK and DecodeItemIds) on the features of one
request, one torch thread, run eagerly, as TorchScript (as the export scripts it, without the
optimizing executor, as the step's config says), as the package compiled for this CPU and as the
one compiled for x86-64-v3; and how long each package took to export and compile, into a fresh
cache (the compile's time, not the cache's). Calls interleave, so the machine's load weighs on
all four alike. Then the model alone (a graph whose libtorch step is the model, its scores over the
catalog the step's output) as TorchScript and as a package, interleaved likewise: the model's
forward, without the selection and decoding the library compiles around it.

``./run bench`` measures it at the end of its run; ``./run bench --only compiled`` measures it
alone (a few minutes: the example is trained and both packages compiled) and writes
``compiled.{json,md}``."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from merlin.table import TensorTable

from benchmarks.systems import project_ensemble
from benchmarks.workload import build_workload
from merlin_torch_serving import Ensemble, PredictPytorch, TransformWorkflow
from merlin_torch_serving.aot.compiling import compiled_package, export_program
from merlin_torch_serving.aot.instruction_sets import instruction_set
from merlin_torch_serving.aot.package import CompiledPackage
from merlin_torch_serving.aot.steps import EXAMPLE, StepModule, step_label, tensors
from merlin_torch_serving.data import frames, wire
from merlin_torch_serving.data.samples import sample_table
from merlin_torch_serving.export.fusion import libtorch_module
from merlin_torch_serving.export.partition import partition
from merlin_torch_serving.graph.plan import REQUEST, Ref, run_calls

FORMS = ("eager", "torchscript", "package", "package x86-64-v3")
MODEL_FORMS = ("torchscript", "package")
SESSION_COUNTS = (1, 32)
REPETITIONS = 200  # as the full run's in-process parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench --only compiled", description=__doc__)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--repetitions", type=int, default=REPETITIONS)
    arguments = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-compiled-") as scratch:
        workload = build_workload(Path(scratch), session_counts=SESSION_COUNTS, progress=False)
        result = measure(workload, arguments.repetitions, _Said())
    record = {
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "repetitions": arguments.repetitions,
        **result,
    }
    arguments.output_dir.mkdir(parents=True, exist_ok=True)
    (arguments.output_dir / "compiled.json").write_text(json.dumps(record, indent=1))
    report = "\n".join(
        [
            *markdown(result),
            f"Load average before/after: {record['load_average_before']} /"
            f" {record['load_average_after']}.",
            "",
        ]
    )
    (arguments.output_dir / "compiled.md").write_text(report)
    print(report, flush=True)
    return 0


class _Said:
    """``measure``'s progress, one line a step."""

    def step(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def measure(workload, repetitions: int, progress) -> dict:
    """``{"forward_ms": {sessions: {form: median ms}}, "model_forward_ms": {sessions: {form: median
    ms}}, "compile_s": {instruction set: s}}``."""
    # exportable forms exist where a package may be made; the TorchScript form is there either way
    steps, step = _libtorch_step(project_ensemble(workload, backend="pytorch", compiled="package"))
    model_steps, model_step = _libtorch_step(_model_alone(workload))
    example = tensors(wire.to_wire(sample_table(step.input_schema, *EXAMPLE)))
    packages, compile_s = {}, {}
    with tempfile.TemporaryDirectory(prefix="merlin-torch-serving-packages-") as cache:
        for name in ("native", "x86-64-v3"):
            progress.step(f"compiling the model's step ahead of time for {name} (a fresh cache)")
            began = time.perf_counter()
            packages[name] = _package(step, example, name, cache)
            compile_s[name] = round(time.perf_counter() - began, 1)
        progress.step("compiling the model alone ahead of time for native")
        model_example = tensors(wire.to_wire(sample_table(model_step.input_schema, *EXAMPLE)))
        model_package = _package(model_step, model_example, "native", cache)
        calls = {
            "eager": _eager(step),
            "torchscript": libtorch_module(step),
            "package": packages["native"],
            "package x86-64-v3": packages["x86-64-v3"],
        }
        model_calls = {"torchscript": libtorch_module(model_step), "package": model_package}
        forward_ms, model_forward_ms = {}, {}
        for sessions, requests in workload.requests.items():
            forward_ms[str(sessions)] = _timed(
                calls, _step_inputs(steps, step, requests), repetitions
            )
            model_forward_ms[str(sessions)] = _timed(
                model_calls, _step_inputs(model_steps, model_step, requests), repetitions
            )
    return {"forward_ms": forward_ms, "model_forward_ms": model_forward_ms, "compile_s": compile_s}


def _libtorch_step(ensemble: Ensemble):
    """The ensemble's steps as the export cuts them, and its libtorch step."""
    steps = partition(ensemble.plan, "forward")
    return steps, next(s for s in steps if s.backend == "pytorch")


def _model_alone(workload) -> Ensemble:
    """The example's workflow (a python step) and its model (the libtorch step), nothing after."""
    workflow = workload.workflow
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    model = PredictPytorch(workload.session_model, backend="pytorch", compiled="package")
    return Ensemble(features >> model, workflow.input_schema)


def _eager(step) -> StepModule:
    return StepModule(step, [call.op.exportable(call.input_schema) for call in step.calls])


def _package(step, example: dict, instruction_set_name: str, cache: str) -> CompiledPackage:
    """``step`` exported and compiled for that instruction set, one thread, into ``cache``."""
    label = f"{step_label(step)} ({instruction_set_name})"
    program = export_program(_eager(step), example, label)
    path = compiled_package(
        program,
        example,
        label=label,
        instruction_set=instruction_set(instruction_set_name),
        threads=1,
        cache_dir=cache,
    )
    return CompiledPackage(path, label)


def _step_inputs(steps, step, requests) -> list[dict[str, torch.Tensor]]:
    """The libtorch step's input tensors for each request: the python steps before it run first."""
    inputs = []
    for frame in requests:
        table = frames.frame_to_table(frame, steps[0].input_schema)
        env = {Ref(REQUEST, name): column for name, column in table.items()}
        for before in steps[: steps.index(step)]:
            run_calls(before.calls, env, {})
        columns = TensorTable({name: env[ref] for name, ref in step.inputs.items()}, _unsafe=True)
        inputs.append(tensors(wire.to_wire(columns)))
    return inputs


def _timed(calls: dict, inputs: list[dict], repetitions: int) -> dict[str, float]:
    """Median ms of each form over ``repetitions`` calls, the forms taking turns call by call."""
    samples: dict[str, list[float]] = {form: [] for form in calls}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            for index in range(len(inputs) + repetitions):  # one untimed pass first
                given = inputs[index % len(inputs)]
                for form, call in calls.items():
                    began = time.perf_counter()
                    call(given)
                    if index >= len(inputs):
                        samples[form].append((time.perf_counter() - began) * 1000.0)
    finally:
        torch.set_num_threads(before)
    return {form: round(statistics.median(values), 4) for form, values in samples.items()}


def markdown(result: dict) -> list[str]:
    """The section of latest.md on the compiled step."""
    forward = result["forward_ms"]
    lines = [
        "## Compiled ahead of time",
        "",
        "One forward of the mixed export's libtorch step (model, TopK, DecodeItemIds) in this"
        " process, one torch thread, median ms of interleaved calls; each package exported and"
        " compiled into a fresh cache: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result["compile_s"].items())
        + ".",
        "",
        *_table(forward, FORMS),
    ]
    model = result.get("model_forward_ms")
    if model:
        lines += [
            "",
            "The model alone, its forward as the libtorch step of a graph that ends with it (scores"
            " over the whole catalog), interleaved likewise:",
            "",
            *_table(model, MODEL_FORMS),
        ]
    return [*lines, ""]


def _table(forward: dict, forms: tuple[str, ...]) -> list[str]:
    """A markdown table of median ms per session count and form, with package / TorchScript."""
    lines = [
        "| sessions | " + " | ".join(forms) + " | package / torchscript |",
        "| ---: |" + " ---: |" * (len(forms) + 1),
    ]
    for sessions, medians in forward.items():
        ratio = medians["package"] / medians["torchscript"]
        cells = " | ".join(f"{medians[form]:.3f}" for form in forms)
        lines.append(f"| {sessions} | {cells} | {ratio:.2f} |")
    return lines
