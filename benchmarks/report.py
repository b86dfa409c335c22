"""The run written out: latest.json (everything), latest.md (tables, targets, environment) and
latest.png (this project against Merlin Systems, see ``chart``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from benchmarks import chart
from benchmarks.environment import BUSY_MACHINE_CORES
from benchmarks.results import (
    LIBTORCH,
    MIXED,
    PACKAGE,
    PROJECT,
    SYSTEM_LABELS,
    Measurement,
    ServerStart,
    as_dicts,
    find,
)
from benchmarks.targets import (
    ASYNC_CLIENT,
    ASYNC_COROUTINES,
    CLIENT_THREADS,
    INTERLEAVED,
    PREBUILT_CLIENT,
    PROJECT_CLIENT,
    Target,
)


def write_json(
    path: Path,
    run: dict,
    measurements: list[Measurement],
    starts: list[ServerStart],
    targets: list[Target],
) -> None:
    document = {
        **run,
        "measurements": as_dicts(measurements),
        "server_starts": as_dicts(starts),
        "targets": [
            {
                "name": t.name,
                "ratio": round(t.ratio, 4),
                "limit": t.limit,
                "at_most": t.at_most,
                "passed": t.passed,
                "detail": t.detail,
            }
            for t in targets
        ],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def write_markdown(
    path: Path,
    run: dict,
    measurements: list[Measurement],
    starts: list[ServerStart],
    targets: list[Target],
    compiled_section: Sequence[str] = (),
) -> None:
    machine = run["environment"]
    uncommitted = " with uncommitted changes" if machine["uncommitted_changes"] else ""
    quick = " --quick" if run["settings"]["mode"] == "quick" else ""
    quick += " --only client" if run["settings"].get("client_only") else ""
    lines = [
        "# Serving benchmark: session-based Transformers4Rec model with its NVTabular workflow",
        "",
        (
            f"{machine['date_utc']} on {machine['cpu']} ({machine['logical_cpus']} logical CPUs, "
            f"{machine['memory_gb']} GB, no GPU), commit {machine['commit']}"
            f"{uncommitted}; mode `{run['settings']['mode']}`, produced by `./run bench{quick}`."
        ),
        "",
        "## Targets",
        "",
        "```",
        *[target.line() for target in targets],
        "```",
        "",
        _disturbance_summary(measurements),
        "",
        "## Latency and throughput",
        "",
    ]
    if not run["settings"].get("client_only"):  # the chart compares with Merlin Systems
        lines += [
            (
                "![p50 latency and sessions per second, this project against Merlin Systems"
                " 23.08, with the in-process limit and the Triton floor as reference"
                f" lines]({path.with_suffix('.png').name})"
            ),
            "",
        ]
    lines += [
        (
            "Each server first answers its cold-start requests (below) and then every request of"
            f" every setting {run['settings']['steady_state_passes']} times, so rows measure a"
            " server that has been serving for a while. Each row:"
            f" {run['settings']['warmup_requests']} warm-up requests, then up to"
            f" {run['settings']['timed_requests']} timed requests or"
            f" {run['settings']['time_budget_s']:g} s, whichever comes first (`n` is how many were"
            " timed). Latency is from the call to the full answer in the client. `other CPU` is"
            " how many cores other processes, or other virtual machines (steal), took meanwhile; a"
            f" row measured while it exceeded {BUSY_MACHINE_CORES:g} was measured once more after a"
            " pause, and the less disturbed attempt kept; rows marked `!` stayed above it."
        ),
        "",
        (
            "| system | protocol | client | sessions | clients | n | p50 ms | p90 ms | p99 ms |"
            " requests/s | sessions/s | server RSS MB | other CPU |"
        ),
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in measurements:
        flag = " !" if m.other_cpu_cores > BUSY_MACHINE_CORES else ""
        flag += f" ({m.attempts} tries)" if m.attempts > 1 else ""
        rss = f"{m.server_rss_mb:.0f}" if m.server_rss_mb is not None else "-"
        lines.append(
            f"| {SYSTEM_LABELS[m.system]} | {m.protocol} | {m.client} | {m.sessions} |"
            f" {m.concurrency} | {m.requests} | {m.p50_ms:.2f} | {m.p90_ms:.2f} | {m.p99_ms:.2f} |"
            f" {m.requests_per_s:.1f} | {m.sessions_per_s:.0f} | {rss} |"
            f" {m.other_cpu_cores:.2f}{flag} |"
        )
    lines += [
        "",
        "## Cold start",
        "",
        (
            "From launching tritonserver to the first answer (gRPC, one session, the system's first"
            " client path; the client is connected and has read the model's metadata before its"
            " first inference)."
        ),
        "",
        (
            "| system | steps | start to ready s | start to first answer s | first request ms |"
            " steady p50 ms | first / steady | RSS after ready MB | other CPU |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in starts:
        ratio = s.first_request_ms / s.steady_p50_ms if s.steady_p50_ms else float("nan")
        lines.append(
            f"| {SYSTEM_LABELS[s.system]} |"
            f" {s.ensemble_steps if s.ensemble_steps is not None else '-'} |"
            f" {s.start_to_ready_s:.1f} | {s.start_to_first_answer_s:.1f} |"
            f" {s.first_request_ms:.2f} | {s.steady_p50_ms:.2f} | {ratio:.1f} |"
            f" {s.rss_after_ready_mb:.0f} | {s.other_cpu_cores:.2f} |"
        )
    lines += [
        "",
        (
            f"The first {len(starts[0].first_requests_ms) if starts else 0} requests after ready,"
            " one at a time (ms):"
        ),
        "",
        *[
            f"- {SYSTEM_LABELS[s.system]}: {', '.join(f'{ms:.1f}' for ms in s.first_requests_ms)}"
            for s in starts
        ],
    ]
    if any(m.system == PROJECT for m in measurements):
        lines += [
            "",
            "## The mixed export beside the all-python one",
            "",
            *_mixed_beside_python(measurements, starts),
        ]
    if any(m.system == PACKAGE for m in measurements):
        lines += ["", *_package_beside_torchscript(measurements, starts)]
    if compiled_section:
        lines += ["", *compiled_section]
    if any(m.client == ASYNC_CLIENT for m in measurements):
        lines += ["", "## What the clients cost", "", *_client_cost(measurements)]
    if run["in_process_parts"]:
        lines += ["", "## Where the time goes", "", *_time_split(run, measurements)]
    lines += ["", "## What each system is", "", *[f"- {note}" for note in run["notes"]]]
    lines += [
        "",
        "## Environment",
        "",
        (
            f"- Python {machine['python']} on {machine['os']}; torch threads in this process:"
            f" {machine['torch_threads']}"
        ),
        (
            f"- tritonserver {run.get('tritonserver_version') or 'unknown'} (bundled with"
            " nvidia-pytriton) with its python backend, and Triton's pytorch backend built for"
            " this torch by `merlin-torch-serving build-backend pytorch`"
        ),
        "- " + ", ".join(f"{name} {version}" for name, version in machine["packages"].items()),
        (
            f"- load average at start: {machine['load_average_at_start']}; workload:"
            f" {run['workload']['train_sessions']} training sessions, catalog of"
            f" {run['workload']['catalog']} encoded item ids, trained {run['workload']['epochs']}"
            f" epoch(s) in {run['workload']['training_s']:.0f} s"
        ),
        f"- whole run: {run['wall_s']:.0f} s",
        "",
    ]
    path.write_text("\n".join(lines))


def _mixed_beside_python(measurements: list[Measurement], starts: list[ServerStart]) -> list[str]:
    """(e) and (f) against (c) on the same requests and server settings: latency, throughput, cold
    start."""
    libtorch = any(m.system == LIBTORCH for m in measurements)
    lines = [
        (
            "Same requests, same `ModelOptions()`, same server settings; `Client` over gRPC."
            " Ratios: mixed / all python" + (", all libtorch / mixed." if libtorch else ".")
        ),
        "",
        "| | (c) all python | (e) mixed |"
        + (" (f) all libtorch |" if libtorch else "")
        + " (e) / (c) |"
        + (" (f) / (e) |" if libtorch else ""),
        "| --- | ---: | ---: | ---: |" + (" ---: | ---: |" if libtorch else ""),
    ]
    systems = [PROJECT, MIXED] + ([LIBTORCH] if libtorch else [])
    for sessions, concurrency in sorted(
        {(m.sessions, m.concurrency) for m in measurements if m.system == PROJECT}
    ):
        found = [find(measurements, s, "grpc", sessions, concurrency, "Client") for s in systems]
        setting = f"{sessions} session(s), {concurrency} client(s)"
        lines.append(_ratio_row(f"p50 ms, {setting}", [m.p50_ms for m in found], 2))
        lines.append(_ratio_row(f"sessions/s, {setting}", [m.sessions_per_s for m in found], 0))
    start = {s.system: s for s in starts}
    if all(system in start for system in systems):
        for label, field, digits in (
            ("start to ready s", "start_to_ready_s", 1),
            ("first request after ready ms", "first_request_ms", 2),
            ("RSS after ready MB", "rss_after_ready_mb", 0),
        ):
            values = [getattr(start[system], field) for system in systems]
            lines.append(_ratio_row(label, values, digits))
    return lines


def _package_beside_torchscript(
    measurements: list[Measurement], starts: list[ServerStart]
) -> list[str]:
    """(g) against (f): the same all-libtorch graph, an AOTInductor package against TorchScript."""
    lines = [
        "## The all-libtorch export compiled ahead of time beside its TorchScript",
        "",
        "Same requests, same `ModelOptions()`, same pytorch-only server; `Client` over gRPC.",
        "",
        "| | (f) TorchScript | (g) package | (g) / (f) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for sessions, concurrency in sorted(
        {(m.sessions, m.concurrency) for m in measurements if m.system == PACKAGE}
    ):
        found = [
            find(measurements, s, "grpc", sessions, concurrency, "Client")
            for s in (LIBTORCH, PACKAGE)
        ]
        setting = f"{sessions} session(s), {concurrency} client(s)"
        lines.append(_ratio_row(f"p50 ms, {setting}", [m.p50_ms for m in found], 2))
        lines.append(_ratio_row(f"sessions/s, {setting}", [m.sessions_per_s for m in found], 0))
    start = {s.system: s for s in starts}
    if LIBTORCH in start and PACKAGE in start:
        for label, field, digits in (
            ("start to ready s", "start_to_ready_s", 2),
            ("first request after ready ms", "first_request_ms", 2),
            ("RSS after ready MB", "rss_after_ready_mb", 0),
        ):
            values = [getattr(start[system], field) for system in (LIBTORCH, PACKAGE)]
            lines.append(_ratio_row(label, values, digits))
    return lines


def _client_cost(measurements: list[Measurement]) -> list[str]:
    """Per export and protocol: one session through prebuilt tritonclient requests, ``Client`` and
    ``AsyncClient``, what each client adds, and the throughput of threads against coroutines."""
    lines = [
        (
            "One session per request. `Client` and `AsyncClient` take the DataFrame of raw rows and"
            " return a DataFrame; `tritonclient, prebuilt` sends tensors built before timing. The"
            " three take turns request by request from one event loop (the `interleaved` rows),"
            " so that the machine's drift weighs on all alike. Own cost: `Client`'s p50 minus"
            " prebuilt's; async extra: `AsyncClient`'s p50 minus `Client`'s. Throughput:"
            f" {CLIENT_THREADS} threads, each with its `Client`, against {ASYNC_COROUTINES}"
            " coroutines of one event loop sharing one `AsyncClient`."
        ),
        "",
        (
            "| system | protocol | prebuilt p50 ms | Client p50 ms | own cost ms | AsyncClient"
            f" p50 ms | async extra ms | Client x{CLIENT_THREADS} sessions/s | AsyncClient"
            f" x{ASYNC_COROUTINES} sessions/s |"
        ),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, protocol in sorted(
        {(m.system, m.protocol) for m in measurements if m.client == ASYNC_CLIENT}
    ):
        prebuilt, client, awaited = (
            find(measurements, system, protocol, 1, 1, name + INTERLEAVED)
            for name in (PREBUILT_CLIENT, PROJECT_CLIENT, ASYNC_CLIENT)
        )
        threads = find(measurements, system, protocol, 1, CLIENT_THREADS, PROJECT_CLIENT)
        coroutines = find(measurements, system, protocol, 1, ASYNC_COROUTINES, ASYNC_CLIENT)
        lines.append(
            f"| {SYSTEM_LABELS[system]} | {protocol} | {prebuilt.p50_ms:.3f} |"
            f" {client.p50_ms:.3f} | {client.p50_ms - prebuilt.p50_ms:.3f} |"
            f" {awaited.p50_ms:.3f} | {awaited.p50_ms - client.p50_ms:.3f} |"
            f" {threads.sessions_per_s:.0f} | {coroutines.sessions_per_s:.0f} |"
        )
    return lines


def _ratio_row(label: str, values: list[float], digits: int) -> str:
    """``values`` of (c), (e) [and (f)], then (e)/(c) [and (f)/(e)]."""
    ratios = [values[i] / values[i - 1] for i in range(1, len(values))]
    cells = [f"{value:.{digits}f}" for value in values] + [f"{ratio:.2f}" for ratio in ratios]
    return f"| {label} | " + " | ".join(cells) + " |"


def _disturbance_summary(measurements: list[Measurement]) -> str:
    disturbed = [m for m in measurements if m.other_cpu_cores > BUSY_MACHINE_CORES]
    if not disturbed:
        return (
            "No measurement was disturbed: other processes and virtual machines never took more"
            f" than {BUSY_MACHINE_CORES:g} cores while one ran."
        )
    return (
        f"**{len(disturbed)} of {len(measurements)} measurements were taken while other processes"
        f" or virtual machines took more than {BUSY_MACHINE_CORES:g} cores** (marked `!` below); on"
        " 2 cores that can multiply torch's latency, so treat those rows, and the targets that use"
        " them, with suspicion."
    )


def _time_split(run: dict, measurements: list[Measurement]) -> list[str]:
    """In-process parts, and the server's share of each latency.

    The server's share is for 1-session single-client gRPC.
    """
    lines = [
        (
            "In-process parts (median ms of `Ensemble.transform` split by operator; `compute sum`"
            " adds the workflow, the model forward and top-k; other processes and virtual machines"
            f" took {run['in_process_parts_other_cpu_cores']:.2f} cores meanwhile):"
        ),
        "",
        "| part | " + " | ".join(f"{n} session(s)" for n in run["in_process_parts"]) + " |",
        "| --- | " + " | ".join("---:" for _ in run["in_process_parts"]) + " |",
    ]
    parts = list(next(iter(run["in_process_parts"].values())))
    for part in parts:
        lines.append(
            f"| {part} | "
            + " | ".join(f"{run['in_process_parts'][n][part]:.3f}" for n in run["in_process_parts"])
            + " |"
        )
    lines += [
        "",
        (
            "Served, one session, one client: the client's p50 next to Triton's own mean time per"
            " request of each model (queue + compute; an ensemble's time includes its steps). The"
            " rest is the client, the network stack and the protocol."
        ),
        "",
        "| system | protocol | client | client p50 ms | server time per model (mean ms) |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for m in measurements:
        if m.sessions != 1 or m.concurrency != 1 or not m.server_side:
            continue
        models = "; ".join(
            f"{name}: {stats['request_ms']:.2f} (queue {stats['queue_ms']:.2f})"
            for name, stats in m.server_side.items()
        )
        lines.append(
            f"| {SYSTEM_LABELS[m.system]} | {m.protocol} | {m.client} | {m.p50_ms:.2f} | {models} |"
        )
    return lines + _merlin_split(run)


def _merlin_split(run: dict) -> list[str]:
    """Where (d)'s time goes, by operator of Merlin's executor, per request size."""
    split = run.get("merlin_breakdown") or {}
    if not split:
        return []
    sizes = list(split)
    cells: dict[str, dict[str, str]] = {}
    for size, measured in split.items():
        for row in measured["executor"]["steps"]:
            calls = f" ({row['calls']:g})" if "calls" in row else ""
            cells.setdefault(row["step"], {})[size] = f"{row['ms']:.2f}{calls}"
        cells.setdefault("whole request in the executor model", {})[size] = (
            f"{measured['executor']['whole_ms']:.2f}"
        )
        for workflow, inner in measured.get("workflows", {}).items():
            for row in inner["steps"]:
                calls = f" ({row['calls']:g})" if "calls" in row else ""
                cells.setdefault(f"NVTabular in `{workflow}`: {row['step']}", {})[size] = (
                    f"{row['ms']:.2f}{calls}"
                )
        for model, row in measured["models"].items():
            cells.setdefault(f"Triton model `{model}`", {})[size] = (
                f"{row['calls'] * row['ms_per_call']:.2f} ({row['calls']:g})"
            )
        cells.setdefault("client p50 (one client, gRPC)", {})[size] = (
            f"{measured['p50_ms']:.2f}"
            + (" !" if measured["other_cpu_cores"] > BUSY_MACHINE_CORES else "")
        )
    return [
        "",
        (
            "Where (d)'s time goes: the same requests sent to a copy of Merlin's executor model"
            " whose executor times each operator (benchmarks/merlin_executor.py, made for this"
            " benchmark: Merlin's own executor model and LocalExecutor, timed), one client over"
            " gRPC, its workflow model copied the same way (NVTabular rows: its workflow's"
            " operators, as merlin-core's executor runs them); ms a request, calls a request in"
            " brackets."
            " Triton model rows are Triton's"
            " statistics of each model a request ran (the workflow runs in a model of its own,"
            " called from the executor model)."
        ),
        "",
        "| step | " + " | ".join(f"{size} session(s)" for size in sizes) + " |",
        "| --- | " + " | ".join("---:" for _ in sizes) + " |",
        *(
            f"| {step} | " + " | ".join(values.get(size, "") for size in sizes) + " |"
            for step, values in cells.items()
        ),
    ]


def write_chart(path: Path, measurements: list[Measurement]) -> None:
    chart.draw(path, measurements)
