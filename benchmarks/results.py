"""The records a run produces, as saved in latest.json.

There is one per measurement and one per server start.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

IN_PROCESS = "in-process"
FLOOR = "triton-floor"
PROJECT = "merlin-torch-serving"
MIXED = "merlin-torch-serving-mixed"
LIBTORCH = "merlin-torch-serving-libtorch"
PACKAGE = "merlin-torch-serving-package"
MERLIN = "merlin-systems"
PROJECT_SHARED = "merlin-torch-serving-shared"
MIXED_SHARED = "merlin-torch-serving-mixed-shared"

SYSTEM_LABELS = {
    IN_PROCESS: "(a) in-process limit",
    FLOOR: "(b) Triton floor",
    PROJECT: "(c) this project, all python",
    MIXED: "(e) this project, mixed",
    LIBTORCH: "(f) this project, all libtorch",
    PACKAGE: "(g) this project, all libtorch, compiled ahead of time",
    MERLIN: "(d) Merlin Systems 23.08",
    PROJECT_SHARED: "(c) sharing a server with (e)",
    MIXED_SHARED: "(e) sharing a server with (c)",
}
#: an export measured in a server it shares with the other export -> the same export served alone
ALONE = {PROJECT_SHARED: PROJECT, MIXED_SHARED: MIXED}


@dataclass
class Measurement:
    """One (system, protocol, client path, sessions per request, concurrency) setting."""

    system: str
    protocol: str
    client: str
    sessions: int
    concurrency: int
    requests: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    requests_per_s: float
    sessions_per_s: float
    wall_s: float
    #: peak RSS of tritonserver and its stubs during the measurement; None in-process
    server_rss_mb: float | None
    #: cores other processes used meanwhile, plus those the hypervisor gave to other virtual
    #: machines (steal, also on its own)
    other_cpu_cores: float
    steal_cores: float
    #: Triton's per-model means over the timed requests (see server_stats.per_request_ms)
    server_side: dict = field(default_factory=dict)
    #: how many times it was measured (again while other processes kept the machine busy)
    attempts: int = 1

    @property
    def key(self) -> tuple:
        return (self.system, self.protocol, self.client, self.sessions, self.concurrency)


@dataclass
class ServerStart:
    """A served system's start and first answer (gRPC, one session, its first client path)."""

    system: str
    models: list[str]
    ensemble_steps: int | None
    start_to_ready_s: float
    start_to_first_answer_s: float
    #: the first inference after the server reported ready (the client was connected before)
    first_request_ms: float
    #: the first few inferences after ready, one at a time, each a different request
    first_requests_ms: list[float]
    rss_after_ready_mb: float
    #: cores other processes (and other virtual machines) took during the first requests
    other_cpu_cores: float
    #: p50 of the same client path, protocol and size once warm (filled in after the load runs)
    steady_p50_ms: float | None = None


def as_dicts(records) -> list[dict]:
    return [asdict(record) for record in records]


def find(
    measurements: list[Measurement],
    system: str,
    protocol: str,
    sessions: int,
    concurrency: int,
    client: str | None = None,
) -> Measurement:
    """The measurement of a setting; with no ``client``, the system's first client path."""
    for measurement in measurements:
        if (
            measurement.system,
            measurement.protocol,
            measurement.sessions,
            measurement.concurrency,
        ) == (
            system,
            protocol,
            sessions,
            concurrency,
        ) and (client is None or measurement.client == client):
            return measurement
    raise KeyError(
        f"no measurement of {system} {protocol} {sessions} session(s) concurrency {concurrency}"
        f" client {client}"
    )


def measurement_from_load(
    system, protocol, client, sessions, concurrency, result, rss_mb, other, server_side
) -> Measurement:
    """The record of one measurement.

    It holds a load result, the peak server RSS, and the CPU others took meanwhile.
    """
    return Measurement(
        system=system,
        protocol=protocol,
        client=client,
        sessions=sessions,
        concurrency=concurrency,
        requests=result.requests,
        p50_ms=round(result.percentile_ms(50), 4),
        p90_ms=round(result.percentile_ms(90), 4),
        p99_ms=round(result.percentile_ms(99), 4),
        mean_ms=round(float(result.latencies_ms.mean()), 4),
        requests_per_s=round(result.requests_per_s, 2),
        sessions_per_s=round(result.requests_per_s * sessions, 1),
        wall_s=round(result.wall_s, 3),
        server_rss_mb=round(rss_mb, 1) if rss_mb is not None else None,
        other_cpu_cores=round(other.other_cores, 3),
        steal_cores=round(other.steal_cores, 3),
        server_side=server_side,
    )
