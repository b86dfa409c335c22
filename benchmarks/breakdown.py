"""Where a served request's time goes, step by step: inside Merlin's executor model (the timers of
benchmarks/merlin_executor.py, in a copy of the model made here) and in this project's steps (their
own ``mts_operator_seconds_total`` counters on the metrics endpoint), each beside Triton's
statistics of every model the request ran (how many times a request ran it, and for how long).

A breakdown is measured over the timed window of one setting: snapshots when timing starts
(``run_load``'s ``on_timing_start``) and after it ends, differenced, divided by the requests.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

from benchmarks import server_stats
from benchmarks.load import LoadResult, LoadSettings, run_load
from benchmarks.merlin_executor import (
    KEEP_RESULTS_PARAMETER,
    MODEL_PARAMETER,
    TIMERS_FILE_PARAMETER,
    WORKFLOW_MODELS_PARAMETER,
    KeptResultsExecutor,
    TimedExecutor,
)
from merlin_torch_serving.export.step_metrics import FLUSH_INTERVAL_S

EXECUTOR_MODEL_FILE = Path(__file__).with_name("merlin_executor.py")
_SERIES = re.compile(r"^(mts_operator_seconds_total|mts_requests_total)\{([^}]*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def add_executor_variant(
    repository: Path,
    name: str,
    *,
    keep_results: bool,
    timers_dir: Path,
    source: str = "executor_model",
) -> dict[str, Path]:
    """Copy Merlin's executor model ``source`` in ``repository`` as ``name``, and each of its
    NVTabular workflow models as ``<workflow>-<name>`` for the copy to call, all running
    benchmarks/merlin_executor.py (timers; each node's result kept when ``keep_results``). The
    timers files they write (in ``timers_dir``): "executor", then "workflow <model>" for each."""
    workflows = sorted(
        folder.name
        for folder in repository.iterdir()
        if any(folder.glob("*/workflow")) and MODEL_PARAMETER not in _config_text(folder)
    )
    timers = {"executor": timers_dir / f"{name}.json"}
    copies = {}
    for workflow in workflows:
        copies[workflow] = f"{workflow}-{name}"
        timers[f"workflow {workflow}"] = timers_dir / f"{copies[workflow]}.json"
        _copy_model(
            repository,
            workflow,
            copies[workflow],
            {
                MODEL_PARAMETER: "workflow",
                TIMERS_FILE_PARAMETER: str(timers[f"workflow {workflow}"]),
            },
            keep_results,
        )
    _copy_model(
        repository,
        source,
        name,
        {
            MODEL_PARAMETER: "executor",
            TIMERS_FILE_PARAMETER: str(timers["executor"]),
            WORKFLOW_MODELS_PARAMETER: json.dumps(copies),
        },
        keep_results,
    )
    return timers


def _copy_model(
    repository: Path, source: str, name: str, parameters: dict[str, str], keep_results: bool
) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    folder = repository / name
    shutil.copytree(repository / source, folder)
    for model_file in folder.glob("*/model.py"):
        shutil.copyfile(EXECUTOR_MODEL_FILE, model_file)
    config = text_format.Parse(_config_text(folder), model_config_pb2.ModelConfig())
    config.name = name
    for key, value in {
        **parameters,
        KEEP_RESULTS_PARAMETER: "true" if keep_results else "false",
    }.items():
        config.parameters[key].string_value = value
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))


def _config_text(folder: Path) -> str:
    path = folder / "config.pbtxt"
    return path.read_text() if path.exists() else ""


def measure(
    make_sender,
    concurrency: int,
    settings: LoadSettings,
    *,
    http_url: str,
    model: str,
    timers: dict[str, Path] | None = None,
    metrics_url: str | None = None,
) -> tuple[LoadResult, dict]:
    """Run the load and return it with its breakdown: Merlin's timers (``timers``, as
    ``add_executor_variant`` returns them) or this project's step counters (``metrics_url``), and
    Triton's statistics of every model, per request of ``model`` (the one the clients call)."""
    before: dict = {}
    timers = timers or {}

    def snapshot() -> None:
        before["statistics"] = server_stats.snapshot(http_url)
        before["timers"] = {label: read_timers(path) for label, path in timers.items()}
        if metrics_url is not None:
            before["metrics"] = scrape(metrics_url)

    result = run_load(make_sender, concurrency, settings, on_timing_start=snapshot)
    breakdown: dict = {}
    if timers:
        after = {label: read_timers(path) for label, path in timers.items()}
        breakdown["executor"] = executor_steps(before["timers"]["executor"], after["executor"])
        requests = breakdown["executor"]["requests"]
        breakdown["workflows"] = {
            label.removeprefix("workflow "): executor_steps(
                before["timers"][label], after[label], requests
            )
            for label in timers
            if label != "executor"
        }
    if metrics_url is not None:
        # the steps publish their counts once a second, off the request path
        time.sleep(FLUSH_INTERVAL_S + 0.5)
        breakdown["steps"] = project_steps(before["metrics"], scrape(metrics_url))
    breakdown["models"] = model_calls(
        before["statistics"], server_stats.snapshot(http_url), model, result.requests
    )
    return result, breakdown


def workflow_in_process(workflow, frames, rounds: int = 3) -> dict[str, dict]:
    """The NVTabular workflow on each request frame in this process, as Merlin's workflow model
    runs it (merlin-core's LocalExecutor) and with each node's result kept: per executor, each
    operator's calls and ms per workflow call, and the whole call's ms."""
    found = {}
    for name, executor in (
        ("merlin-core's LocalExecutor", TimedExecutor()),
        ("results kept", KeptResultsExecutor()),
    ):
        executor.transform(frames[0], workflow.graph)  # NVTabular's first call loads vocabularies
        executor.seconds.clear()
        executor.calls.clear()
        executor.transform_seconds = 0.0
        calls = rounds * len(frames)
        for _ in range(rounds):
            for frame in frames:
                executor.transform(frame, workflow.graph)
        found[name] = {
            "whole_ms": round(executor.transform_seconds * 1000.0 / calls, 3),
            "operators": {
                op: {"ms": round(seconds * 1000.0 / calls, 3), "calls": executor.calls[op] / calls}
                for op, seconds in executor.seconds.items()
            },
        }
    return found


def workflow_markdown(found: dict[str, dict]) -> list[str]:
    names = list(found)
    operators = list(next(iter(found.values()))["operators"])
    return [
        "The NVTabular workflow alone, in this process, as Merlin's workflow model runs it"
        " (merlin-core's LocalExecutor) and with each node's result kept: ms a workflow call"
        " (calls a workflow call):",
        "",
        "| operator | " + " | ".join(names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
        *(
            f"| {op} | "
            + " | ".join(
                f"{found[n]['operators'][op]['ms']:.2f} ({found[n]['operators'][op]['calls']:g})"
                for n in names
            )
            + " |"
            for op in operators
        ),
        "| whole workflow call | "
        + " | ".join(f"{found[n]['whole_ms']:.2f}" for n in names)
        + " |",
    ]


def read_timers(path: Path) -> dict:
    if not path.exists():
        return {"requests": 0, "execute_s": 0.0, "transform_s": 0.0, "operators": {}}
    return json.loads(path.read_text())


def executor_steps(before: dict, after: dict, requests: int | None = None) -> dict:
    """Per operator a Merlin model's executor ran: ms and calls per request, then the executor's
    own work between operators and the model's conversions of the request and the response.
    ``requests``: what to divide by (by default the model's own requests; a workflow model's
    figures are per request of the executor model that called it)."""
    requests = requests or after["requests"] - before["requests"]
    if requests <= 0:
        raise RuntimeError("Merlin's executor model answered no request while it was timed")
    rows = []
    for name, now in after["operators"].items():
        was = before["operators"].get(name, {"seconds": 0.0, "calls": 0})
        rows.append(
            {
                "step": name,
                "ms": round((now["seconds"] - was["seconds"]) * 1000.0 / requests, 3),
                "calls": round((now["calls"] - was["calls"]) / requests, 2),
            }
        )
    rows.sort(key=lambda row: -row["ms"])
    transform_ms = (after["transform_s"] - before["transform_s"]) * 1000.0 / requests
    execute_ms = (after["execute_s"] - before["execute_s"]) * 1000.0 / requests
    operators_ms = sum(row["ms"] for row in rows)
    rows.append({"step": "executor between operators", "ms": round(transform_ms - operators_ms, 3)})
    rows.append(
        {"step": "request and response conversions", "ms": round(execute_ms - transform_ms, 3)}
    )
    return {
        "requests": requests,
        "calls": after["requests"] - before["requests"],
        "whole_ms": round(execute_ms, 3),
        "steps": rows,
    }


def scrape(metrics_url: str) -> dict[tuple[str, str, str], float]:
    """The steps' operator seconds and requests: (series, model, operator) -> value.

    ``metrics_url`` is ``TritonServer.metrics_url`` (``<address>:<port>``)."""
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        match = _SERIES.match(line.strip())
        if match:
            labels = dict(_LABEL.findall(match.group(2)))
            key = (match.group(1), labels.get("model", ""), labels.get("operator", ""))
            found[key] = float(match.group(3))
    return found


def project_steps(before: dict, after: dict) -> dict:
    """Per operator of this project's python steps: ms per request of its step."""
    rows = []
    for (series, model, operator), value in after.items():
        if series != "mts_operator_seconds_total":
            continue
        requests = after.get(("mts_requests_total", model, ""), 0.0) - before.get(
            ("mts_requests_total", model, ""), 0.0
        )
        if requests > 0:
            seconds = value - before.get((series, model, operator), 0.0)
            rows.append(
                {"step": operator, "model": model, "ms": round(seconds * 1000.0 / requests, 3)}
            )
    # in the order the plan runs them: operators are named "<index>:<label>"
    rows.sort(key=lambda row: int(row["step"].split(":", 1)[0]))
    return {"steps": rows}


def model_calls(before: dict, after: dict, model: str, requests: int) -> dict[str, dict]:
    """Per model that ran: its calls per request of ``model`` (``requests`` of it were timed) and
    Triton's mean ms per call.

    The models ``model`` calls count a call before ``model`` answers, so the snapshots around the
    timed requests hold exactly theirs; ``model``'s own count may trail its answers, so it is
    taken as one call a request.
    """
    calls = {}
    for name, stats in server_stats.per_request_ms(before, after).items():
        calls[name] = {
            "calls": 1.0 if name == model else round(stats["requests"] / requests, 2),
            "ms_per_call": round(stats["request_ms"], 3),
        }
    return calls


def markdown(title: str, breakdown: dict) -> list[str]:
    """The breakdown as a table: steps, then the models Triton ran."""
    lines = [f"{title}:", "", "| step | ms a request | calls a request |", "| --- | ---: | ---: |"]
    if "executor" in breakdown:
        for row in breakdown["executor"]["steps"]:
            calls = row.get("calls")
            lines.append(
                f"| {row['step']} | {row['ms']:.2f} | {'' if calls is None else f'{calls:g}'} |"
            )
        lines.append(
            f"| whole request in the executor model | {breakdown['executor']['whole_ms']:.2f} | 1 |"
        )
    for workflow, split in breakdown.get("workflows", {}).items():
        for row in split["steps"]:
            calls = f"{row['calls']:g}" if "calls" in row else ""
            lines.append(
                f"| NVTabular in `{workflow}`: {row['step']} | {row['ms']:.2f} | {calls} |"
            )
        calls = split["calls"] / split["requests"]
        lines.append(
            f"| whole workflow model (`{workflow}`) | {split['whole_ms']:.2f} | {calls:g} |"
        )
    for row in breakdown.get("steps", {}).get("steps", []):
        lines.append(f"| {row['step']} (in `{_short(row['model'])}`) | {row['ms']:.2f} | 1 |")
    for name, row in breakdown["models"].items():
        lines.append(
            f"| Triton model `{_short(name)}` | {row['calls'] * row['ms_per_call']:.2f} |"
            f" {row['calls']:g} |"
        )
    return lines


def _short(model: str) -> str:
    """A step model of this project by its ensemble and index (``multistage-0``): the operators
    it runs are named in the rows above."""
    parts = model.split("-")
    return "-".join(parts[:2]) if len(parts) > 2 and parts[1].isdigit() else model
