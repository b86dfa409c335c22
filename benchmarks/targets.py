"""The targets the report checks, each computed from one run's measurements."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.environment import BUSY_MACHINE_CORES
from benchmarks.results import (
    ALONE,
    FLOOR,
    IN_PROCESS,
    LIBTORCH,
    MERLIN,
    MIXED,
    PACKAGE,
    PROJECT,
    SYSTEM_LABELS,
    Measurement,
    ServerStart,
    find,
)

# The project is measured as a user pays for it: through merlin_torch_serving.Client.
PROJECT_CLIENT = "Client"
#: how much slower an export's p99 may get when it shares its server with the other export
SHARED_P99_LIMIT = 2.0
#: the all-libtorch export against the mixed one: p50, start to ready, server memory
LIBTORCH_P50_LIMIT = 0.7
LIBTORCH_READY_LIMIT = 0.5
LIBTORCH_RSS_LIMIT = 0.6
#: the all-libtorch export compiled ahead of time against its TorchScript: the model's forward
#: in-process, one session's p50 through Client, 32 sessions from 8 clients
PACKAGE_FORWARD_LIMIT = 0.5
PACKAGE_P50_LIMIT = 0.8
PACKAGE_THROUGHPUT_LIMIT = 1.2
#: the clients' own cost, on the exports where it weighs most (mixed, all libtorch): Client's
#: one-session p50 above a prebuilt tritonclient request's; AsyncClient's above Client's; and the
#: sessions/s of ASYNC_COROUTINES coroutines of one event loop against CLIENT_THREADS threads
CLIENT_COST_LIMIT_MS = 0.15
ASYNC_COST_LIMIT_MS = 0.1
ASYNC_CLIENT, PREBUILT_CLIENT = "AsyncClient", "tritonclient, prebuilt"
ASYNC_COROUTINES, CLIENT_THREADS = 64, 8
#: the client paths sent side by side, request by request (see ``interleaved``)
INTERLEAVED = ", interleaved"


@dataclass(frozen=True)
class Target:
    """``ratio`` is compared with ``limit``: at most it when ``at_most``, else at least it."""

    name: str
    ratio: float
    limit: float
    at_most: bool
    detail: str
    #: other processes or virtual machines took the CPU while an input of this target was measured
    disturbed: bool = False
    #: "ms": ``ratio`` is a difference in milliseconds
    unit: str = ""

    @property
    def passed(self) -> bool:
        return self.ratio <= self.limit if self.at_most else self.ratio >= self.limit

    def line(self) -> str:
        bound = "<=" if self.at_most else ">="
        caveat = (
            " [measured while other processes or virtual machines took the CPU]"
            if self.disturbed
            else ""
        )
        measured = (
            f"difference {self.ratio:.3f} ms (target {bound} {self.limit:g} ms)"
            if self.unit == "ms"
            else f"ratio {self.ratio:.2f} (target {bound} {self.limit:g})"
        )
        return (
            f"{'PASS' if self.passed else 'MISS'}  {self.name}: {measured}; {self.detail}{caveat}"
        )


def evaluate(
    measurements: list[Measurement], starts: list[ServerStart], compiled: dict | None = None
) -> list[Target]:
    def project(protocol: str, sessions: int, concurrency: int) -> Measurement:
        return find(measurements, PROJECT, protocol, sessions, concurrency, PROJECT_CLIENT)

    served = project("grpc", 1, 1)
    limit = find(measurements, IN_PROCESS, IN_PROCESS, 1, 1)
    floor = find(measurements, FLOOR, "grpc", 1, 1)
    merlin = find(measurements, MERLIN, "grpc", 1, 1)
    served_busy = project("grpc", 32, 8)
    merlin_busy = find(measurements, MERLIN, "grpc", 32, 8)
    project_start = next(start for start in starts if start.system == PROJECT)
    rss = {system: _peak_rss(measurements, system) for system in (PROJECT, MERLIN)}
    return [
        *_shared_server_targets(measurements),
        *_libtorch_targets(measurements, starts),
        *_package_targets(measurements, compiled or {}),
        *client_targets(measurements),
        Target(
            "1 session, 1 client: p50 of (c) gRPC <= 1.5 x (in-process (a) + Triton floor (b))",
            served.p50_ms / (limit.p50_ms + floor.p50_ms),
            1.5,
            True,
            f"(c) {served.p50_ms:.2f} ms vs (a) {limit.p50_ms:.2f} ms + (b) {floor.p50_ms:.2f} ms "
            f"= {limit.p50_ms + floor.p50_ms:.2f} ms",
            _disturbed(served, limit, floor),
        ),
        Target(
            "1 session, 1 client: p50 of (c) gRPC at least 10 x lower than (d) gRPC",
            merlin.p50_ms / served.p50_ms,
            10.0,
            False,
            f"(d) {merlin.p50_ms:.2f} ms vs (c) {served.p50_ms:.2f} ms",
            _disturbed(merlin, served),
        ),
        Target(
            "32 sessions, 8 clients: throughput of (c) gRPC >= 5 x (d) gRPC",
            served_busy.sessions_per_s / merlin_busy.sessions_per_s,
            5.0,
            False,
            f"(c) {served_busy.sessions_per_s:.0f} sessions/s vs (d)"
            f" {merlin_busy.sessions_per_s:.0f} sessions/s",
            _disturbed(served_busy, merlin_busy),
        ),
        Target(
            "first request after ready <= 2 x steady p50 (c, gRPC, 1 session)",
            project_start.first_request_ms / project_start.steady_p50_ms,
            2.0,
            True,
            f"first {project_start.first_request_ms:.2f} ms vs steady p50"
            f" {project_start.steady_p50_ms:.2f} ms",
            project_start.other_cpu_cores > BUSY_MACHINE_CORES or _disturbed(served),
        ),
        Target(
            "server memory of (c) <= (d) (peak RSS of tritonserver + stubs)",
            rss[PROJECT] / rss[MERLIN],
            1.0,
            True,
            f"(c) {rss[PROJECT]:.0f} MB vs (d) {rss[MERLIN]:.0f} MB",
        ),
    ]


def _libtorch_targets(measurements: list[Measurement], starts: list[ServerStart]) -> list[Target]:
    """(f), the all-libtorch export, against (e), the mixed one: the python step it removes."""
    if not any(m.system == LIBTORCH for m in measurements):
        return []
    libtorch = find(measurements, LIBTORCH, "grpc", 1, 1, PROJECT_CLIENT)
    mixed = find(measurements, MIXED, "grpc", 1, 1, PROJECT_CLIENT)
    start = {s.system: s for s in starts}
    rss = {system: _peak_rss(measurements, system) for system in (LIBTORCH, MIXED)}
    return [
        Target(
            f"1 session, 1 client: p50 of (f) gRPC (Client) <= {LIBTORCH_P50_LIMIT:g} x (e)",
            libtorch.p50_ms / mixed.p50_ms,
            LIBTORCH_P50_LIMIT,
            True,
            f"(f) {libtorch.p50_ms:.2f} ms vs (e) {mixed.p50_ms:.2f} ms",
            _disturbed(libtorch, mixed),
        ),
        Target(
            f"start to ready of (f) <= {LIBTORCH_READY_LIMIT:g} x (e)",
            start[LIBTORCH].start_to_ready_s / start[MIXED].start_to_ready_s,
            LIBTORCH_READY_LIMIT,
            True,
            f"(f) {start[LIBTORCH].start_to_ready_s:.2f} s vs (e)"
            f" {start[MIXED].start_to_ready_s:.2f} s",
        ),
        Target(
            f"server memory of (f) <= {LIBTORCH_RSS_LIMIT:g} x (e) (peak RSS of tritonserver +"
            " stubs)",
            rss[LIBTORCH] / rss[MIXED],
            LIBTORCH_RSS_LIMIT,
            True,
            f"(f) {rss[LIBTORCH]:.0f} MB vs (e) {rss[MIXED]:.0f} MB",
        ),
    ]


def client_targets(measurements: list[Measurement]) -> list[Target]:
    """What ``Client`` and ``AsyncClient`` cost on top of the wire, on each export measured
    through ``AsyncClient`` (the mixed and all-libtorch ones), over each protocol: latencies from
    the three paths sent side by side (``interleaved``), throughput from their own rows."""
    found = []
    for system, protocol in sorted(
        {(m.system, m.protocol) for m in measurements if m.client == ASYNC_CLIENT}
    ):
        label = f"{SYSTEM_LABELS[system]} {protocol}"
        prebuilt, client, awaited = (
            find(measurements, system, protocol, 1, 1, name + INTERLEAVED)
            for name in (PREBUILT_CLIENT, PROJECT_CLIENT, ASYNC_CLIENT)
        )
        threads = find(measurements, system, protocol, 1, CLIENT_THREADS, PROJECT_CLIENT)
        coroutines = find(measurements, system, protocol, 1, ASYNC_COROUTINES, ASYNC_CLIENT)
        found += [
            Target(
                f"1 session: Client's own cost on {label} (its p50 - a prebuilt tritonclient"
                " request's, interleaved)",
                client.p50_ms - prebuilt.p50_ms,
                CLIENT_COST_LIMIT_MS,
                True,
                f"Client {client.p50_ms:.3f} ms vs prebuilt {prebuilt.p50_ms:.3f} ms",
                _disturbed(client, prebuilt),
                unit="ms",
            ),
            Target(
                f"1 session: AsyncClient's p50 on {label} - Client's (interleaved)",
                awaited.p50_ms - client.p50_ms,
                ASYNC_COST_LIMIT_MS,
                True,
                f"AsyncClient {awaited.p50_ms:.3f} ms vs Client {client.p50_ms:.3f} ms",
                _disturbed(awaited, client),
                unit="ms",
            ),
            Target(
                f"1 session: sessions/s of {ASYNC_COROUTINES} AsyncClient coroutines on {label}"
                f" >= {CLIENT_THREADS} threads of Client",
                coroutines.sessions_per_s / threads.sessions_per_s,
                1.0,
                False,
                f"{ASYNC_COROUTINES} coroutines {coroutines.sessions_per_s:.0f} sessions/s vs"
                f" {CLIENT_THREADS} threads {threads.sessions_per_s:.0f} sessions/s",
                _disturbed(coroutines, threads),
            ),
        ]
    return found


def _shared_server_targets(measurements: list[Measurement]) -> list[Target]:
    """Each export's p99 in a server it shares with the other, against its p99 served alone."""
    found = []
    for shared in (m for m in measurements if m.system in ALONE):
        alone = find(
            measurements,
            ALONE[shared.system],
            shared.protocol,
            shared.sessions,
            shared.concurrency,
            shared.client,
        )
        found.append(
            Target(
                f"{shared.sessions} session(s): p99 of {SYSTEM_LABELS[shared.system]} <="
                f" {SHARED_P99_LIMIT:g} x served alone ({shared.protocol}, {shared.client}, one"
                " client each)",
                shared.p99_ms / alone.p99_ms,
                SHARED_P99_LIMIT,
                True,
                f"shared {shared.p99_ms:.2f} ms vs alone {alone.p99_ms:.2f} ms (p50"
                f" {shared.p50_ms:.2f} vs {alone.p50_ms:.2f} ms)",
                _disturbed(shared, alone),
            )
        )
    return found


def _disturbed(*measurements: Measurement) -> bool:
    return any(m.other_cpu_cores > BUSY_MACHINE_CORES for m in measurements)


def _peak_rss(measurements: list[Measurement], system: str) -> float:
    return max(
        m.server_rss_mb for m in measurements if m.system == system and m.server_rss_mb is not None
    )


def _package_targets(measurements: list[Measurement], compiled: dict) -> list[Target]:
    """(g) against (f), and the compiled step's forward against its TorchScript in-process."""
    found = {
        (m.system, m.sessions, m.concurrency): m
        for m in measurements
        if m.protocol == "grpc" and m.client == PROJECT_CLIENT
    }
    targets = []
    forward = compiled.get("forward_ms", {}).get("1")
    model = compiled.get("model_forward_ms", {}).get("1")
    if forward and model:
        targets.append(
            Target(
                "1 session, one thread: the model's forward in-process, package <= 0.5 x"
                " TorchScript",
                model["package"] / model["torchscript"],
                PACKAGE_FORWARD_LIMIT,
                True,
                f"the model alone: package {model['package']:.3f} ms vs TorchScript"
                f" {model['torchscript']:.3f} ms; the model's whole step (with TopK and"
                f" DecodeItemIds): package {forward['package']:.3f} ms vs TorchScript"
                f" {forward['torchscript']:.3f} ms,"
                f" x{forward['package'] / forward['torchscript']:.2f}"
                f" (eager {forward['eager']:.3f} ms; package for x86-64-v3"
                f" {forward['package x86-64-v3']:.3f} ms)",
            )
        )
    one = found.get((PACKAGE, 1, 1)), found.get((LIBTORCH, 1, 1))
    if one[0] and one[1]:
        targets.append(
            Target(
                "1 session, 1 client: p50 of (g) gRPC (Client) <= 0.8 x (f)",
                one[0].p50_ms / one[1].p50_ms,
                PACKAGE_P50_LIMIT,
                True,
                f"(g) {one[0].p50_ms:.2f} ms vs (f) {one[1].p50_ms:.2f} ms",
                disturbed=_disturbed(*one),
            )
        )
    busy = found.get((PACKAGE, 32, 8)), found.get((LIBTORCH, 32, 8))
    if busy[0] and busy[1]:
        targets.append(
            Target(
                "32 sessions, 8 clients: sessions/s of (g) gRPC (Client) >= 1.2 x (f)",
                busy[0].sessions_per_s / busy[1].sessions_per_s,
                PACKAGE_THROUGHPUT_LIMIT,
                False,
                f"(g) {busy[0].sessions_per_s:.0f} vs (f) {busy[1].sessions_per_s:.0f} sessions/s",
                disturbed=_disturbed(*busy),
            )
        )
    return targets
