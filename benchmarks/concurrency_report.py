"""What the concurrency sweep (concurrency.py) reports: its targets, one line each, and its
markdown page, from the points, alternating p50s and cold starts it measured."""

from __future__ import annotations

from benchmarks.environment import BUSY_MACHINE_CORES


def cpu_text(cpu_ms: dict[str, float]) -> str:
    """``server / stubs / clients`` milliseconds, and their sum."""
    return " / ".join(f"{ms:.2f}" for ms in cpu_ms.values()) + f" = {sum(cpu_ms.values()):.2f}"


def flag(other_cores: float) -> str:
    return " !" if other_cores > BUSY_MACHINE_CORES else ""


def targets(
    points, alternating: dict[str, dict[str, float]], cold, cores: int, idle_s: float
) -> list[str]:
    """The sweep's targets, one line each, from its points, alternating p50s and cold starts."""
    found = {(p.export, p.protocol, p.clients): p for p in points}
    lines = []
    for kind in ("python", "mixed", "libtorch"):
        for protocol in sorted({p.protocol for p in points}):
            on32, off32 = (
                found.get((f"{kind}-on", protocol, 32)),
                found.get((f"{kind}-off", protocol, 32)),
            )
            on1, off1 = (
                found.get((f"{kind}-on", protocol, 1)),
                found.get((f"{kind}-off", protocol, 1)),
            )
            if on32 and off32:
                ratio = on32.sessions_per_s / off32.sessions_per_s
                lines.append(
                    f"{kind} {protocol}, 32 clients: sessions/s x{ratio:.2f} batched/unbatched "
                    f"(target >= 5): "
                    f"{'met' if ratio >= 5 else 'NOT met'}; p99 {on32.p99_ms} vs {off32.p99_ms} ms "
                    f"({'met' if on32.p99_ms <= off32.p99_ms else 'NOT met'}); x5 leaves "
                    f"{cores * 1000.0 / (5 * off32.sessions_per_s):.2f} ms of CPU per session on "
                    f"{cores} cores, batched took {cpu_text(on32.cpu_ms_per_session)} ms "
                    f"(tritonserver / python stubs / clients)" + _disturbed(on32, off32)
                )
            if on1 and off1:
                ratio = on1.p50_ms / off1.p50_ms
                on, off = (alternating[protocol][f"{kind}-{state}"] for state in ("on", "off"))
                lines.append(
                    f"{kind} {protocol}, 1 client: p50 {on1.p50_ms} vs {off1.p50_ms} ms, "
                    f"x{ratio:.2f} (target <= 1.10): "
                    f"{'met' if ratio <= 1.10 else 'NOT met'}; alternating request by request "
                    f"{on} vs {off} ms, x{on / off:.2f}: {'met' if on / off <= 1.10 else 'NOT met'}"
                    + _disturbed(on1, off1)
                )
    lines += _libtorch_targets(found, cold)
    lines += _package_targets(found)
    for start in cold:
        ratio = start.first_request_ms / start.steady_p50_ms
        in_server = start.server_first_ms / start.server_steady_mean_ms
        lines.append(
            f"{start.export}: first request {start.first_request_ms} ms = x{ratio:.2f} steady p50 "
            f"(target <= 2): "
            f"{'met' if ratio <= 2 else 'NOT met'}; in the server x{in_server:.2f}; the first "
            f"after {idle_s:g} s idle "
            f"x{start.after_idle_ms / start.steady_p50_ms:.2f}; start to ready "
            f"{start.start_to_ready_s} s" + _disturbed(start)
        )
    return lines


def _disturbed(*measured) -> str:
    """Says so when other processes or virtual machines disturbed any of ``measured``."""
    most = max(m.other_cpu_cores for m in measured)
    if most <= BUSY_MACHINE_CORES:
        return ""
    return f" (disturbed: other processes or virtual machines took {most:.2f} cores)"


def _libtorch_targets(found: dict, cold) -> list[str]:
    """The all-libtorch export against the mixed one, batched, at 32 clients: CPU a session of
    tritonserver and the clients (the python stubs it has none of), and the exports' start."""
    lines = []
    for protocol in sorted({protocol for _, protocol, _ in found}):
        libtorch, mixed = (
            found.get(("libtorch-on", protocol, 32)),
            found.get(("mixed-on", protocol, 32)),
        )
        if libtorch and mixed:
            ours = sum(libtorch.cpu_ms_per_session.values())
            theirs = sum(mixed.cpu_ms_per_session.values())
            ratio = ours / theirs
            lines.append(
                f"libtorch-on vs mixed-on {protocol}, 32 clients: CPU ms a session (tritonserver +"
                f" stubs + clients) {ours:.2f} vs {theirs:.2f}, x{ratio:.2f} (target <= 0.6):"
                f" {'met' if ratio <= 0.6 else 'NOT met'}; sessions/s {libtorch.sessions_per_s}"
                f" vs {mixed.sessions_per_s}"
            )
    start = {c.export: c for c in cold}
    for state in ("off", "on"):
        ours, theirs = start.get(f"libtorch-{state}"), start.get(f"mixed-{state}")
        if ours and theirs:
            ratio = ours.start_to_ready_s / theirs.start_to_ready_s
            lines.append(
                f"libtorch-{state} vs mixed-{state}: start to ready {ours.start_to_ready_s} vs"
                f" {theirs.start_to_ready_s} s, x{ratio:.2f} (target <= 0.5):"
                f" {'met' if ratio <= 0.5 else 'NOT met'}"
            )
    return lines


def _package_targets(found: dict) -> list[str]:
    """The all-libtorch export compiled ahead of time against its TorchScript, unbatched and
    batched, at every client count: sessions/s (target >= 1.2 at 32 clients) and p50."""
    lines = []
    for state in ("off", "on"):
        for protocol in sorted({protocol for _, protocol, _ in found}):
            for clients in sorted({clients for _, _, clients in found}):
                ours = found.get((f"package-{state}", protocol, clients))
                theirs = found.get((f"libtorch-{state}", protocol, clients))
                if not (ours and theirs):
                    continue
                ratio = ours.sessions_per_s / theirs.sessions_per_s
                verdict = ""
                if clients == 32:
                    verdict = f" (target >= 1.2): {'met' if ratio >= 1.2 else 'NOT met'}"
                lines.append(
                    f"package-{state} vs libtorch-{state} {protocol}, {clients} clients:"
                    f" sessions/s {ours.sessions_per_s} vs {theirs.sessions_per_s},"
                    f" x{ratio:.2f}{verdict}; p50 {ours.p50_ms} vs {theirs.p50_ms} ms"
                    + _disturbed(ours, theirs)
                )
    return lines


def markdown(record: dict) -> str:
    points, starts = record["points"], record["cold_starts"]
    exports = list(dict.fromkeys(p["export"] for p in points))
    disturbed = [p for p in points if p.get("other_cpu_cores", 0.0) > BUSY_MACHINE_CORES]
    disturbed_starts = [c for c in starts if c.get("other_cpu_cores", 0.0) > BUSY_MACHINE_CORES]
    lines = [
        f"# Concurrency sweep ({record['started']} UTC, {record['minutes']} min)",
        "",
        f"Load average before/after: {record['load_average_before']} / "
        f"{record['load_average_after']} ({record.get('cores', 2)} cores). "
        f"Closed-loop clients in {record['client_processes']} processes sending pre-serialized "
        f"requests (as perf_analyzer does), one session per request, each client its own sessions, "
        f"{record['rounds']} windows of {record['window_s']} s per point, the exports taking "
        f"turns. Batches: requests per execution of the step that runs the model.",
        "",
        "CPU: milliseconds of CPU per session the server answered, of tritonserver / its python "
        "stubs / the client processes = all. Other CPU: cores other processes or other virtual "
        "machines (steal) took while a window ran, the most of a point's windows; a window (or a "
        f"cold start) during which they took more than {BUSY_MACHINE_CORES:g} was measured once "
        "more after a pause and the less disturbed attempt kept (`n repeated`); `!` marks those "
        "that stayed above it.",
        "",
        (
            f"**{len(disturbed)} of {len(points)} points and {len(disturbed_starts)} of"
            f" {len(starts)} cold starts were measured while other processes or virtual machines"
            f" took more than {BUSY_MACHINE_CORES:g} cores** (marked `!`): treat them, and the"
            " targets that use them, with suspicion."
            if disturbed or disturbed_starts
            else "No point or cold start was disturbed: other processes and virtual machines never"
            f" took more than {BUSY_MACHINE_CORES:g} cores while one ran."
        ),
        "",
        "| export | protocol | clients | p50 ms | p99 ms | sessions/s | mean batch | largest "
        "batch | CPU ms per session | failures | other CPU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        lines.append(
            f"| {p['export']} | {p['protocol']} | {p['clients']} | {p['p50_ms']} | {p['p99_ms']} | "
            f"{p['sessions_per_s']} | {p['mean_batch']} | {p['largest_batch']} | "
            f"{cpu_text(p['cpu_ms_per_session'])} | {p['failures']} | "
            f"{_other_text(p.get('other_cpu_cores', 0.0), p.get('repeated_windows', 0))} |"
        )
    alternating = record["one_client_alternating_p50_ms"]
    lines += [
        "",
        "One client alternating between the exports, request by request "
        f"({record['alternating_rounds']} rounds, the order rotating), p50 ms:",
        "",
        "| protocol | " + " | ".join(exports) + " | other CPU |",
        "| --- |" + " ---: |" * (len(exports) + 1),
        *(
            f"| {protocol} | "
            + " | ".join(str(p50s[e]) for e in exports)
            + f" | {_other_text(p50s.get('other CPU', 0.0), 0)} |"
            for protocol, p50s in alternating.items()
        ),
    ]
    lines += [
        "",
        "| export | start to ready s | first request ms | next requests ms | steady p50 ms | in "
        "the server: first ms | steady mean ms | after 1 s idle ms | other CPU |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in starts:
        lines.append(
            f"| {c['export']} | {c['start_to_ready_s']} | {c['first_request_ms']} | "
            f"{c['next_requests_ms']} | "
            f"{c['steady_p50_ms']} | {c['server_first_ms']} | {c['server_steady_mean_ms']} | "
            f"{c['after_idle_ms']} | "
            f"{_other_text(c.get('other_cpu_cores', 0.0), c.get('attempts', 1) - 1)} |"
        )
    lines += ["", "Targets:", ""] + [f"- {line}" for line in record["targets"]]
    return "\n".join(lines) + "\n"


def _other_text(other_cores: float, repeated: int) -> str:
    return f"{other_cores:.2f}{flag(other_cores)}" + (f" ({repeated} repeated)" if repeated else "")
