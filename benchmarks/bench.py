"""One benchmark run: build the example and the repositories, then measure the in-process limit
and each served system in turn (one tritonserver at a time), then the two exports of this project
sharing one server, collecting the records. ``client_only``: only what the clients themselves cost
on the mixed and all-libtorch exports (``./run bench --only client``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import (
    async_load,
    breakdown,
    compiled,
    floor,
    inprocess,
    interleaved,
    merlin_baseline,
    report,
    server_stats,
    shared,
    systems,
    targets,
)
from benchmarks.environment import BUSY_MACHINE_CORES, OtherCpuLoad, describe_machine
from benchmarks.load import LoadSettings, run_load
from benchmarks.memory import PeakServerMemory, server_processes, server_rss_bytes
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
    measurement_from_load,
)
from benchmarks.workload import MAX_SEQUENCE_LENGTH, TOP_K, build_workload
from examples.session_based import features
from merlin_torch_serving import TritonServer
from merlin_torch_serving.backends import pytorch_backend_directory

_MB = 2**20
# How often a disturbed measurement (see environment.BUSY_MACHINE_CORES) is repeated, and the
# pause before each repeat.
BUSY_RETRIES = 1
BUSY_PAUSE_S = 3.0
# Requests timed one by one right after the server is ready, to show how long it stays cold.
COLD_REQUESTS = 8
# Passes over all requests of all settings between the cold start and the first measurement.
STEADY_STATE_PASSES = 2
# A copy of Merlin's executor model timing each of its operators (benchmarks/merlin_executor.py),
# measured after (d) for where Merlin's time goes.
MERLIN_TIMED = "executor_model_timed"
# The client path of the shared-server measurement: tensors built before timing, so the clients,
# which share this process, add as little CPU as possible to what the server's pools compete for.
SHARED_CLIENT = "tritonclient, prebuilt"


@dataclass(frozen=True)
class Mode:
    """How long each measurement runs; ``part_repetitions`` times each in-process part."""

    name: str
    warmup_requests: int
    timed_requests: int
    time_budget_s: float
    part_repetitions: int


class Benchmark:
    """Builds, measures and records; ``run()`` then ``write()``. ``progress`` prints a line per
    step (``step(message)``) and per measurement (``measured(measurement)``)."""

    def __init__(
        self,
        *,
        mode: Mode,
        work_dir: Path,
        progress,
        session_counts: tuple[int, ...],
        concurrencies: tuple[int, ...],
        protocols: tuple[str, ...],
        server_start_timeout_s: float,
        repository_root: Path,
        client_only: bool = False,
    ):
        self.mode = mode
        self.client_only = client_only
        self.work_dir = work_dir
        self.progress = progress
        self.session_counts = session_counts
        self.concurrencies = concurrencies
        self.protocols = protocols
        self.server_start_timeout_s = server_start_timeout_s
        self.load = LoadSettings(mode.warmup_requests, mode.timed_requests, mode.time_budget_s)
        self.environment = describe_machine(repository_root)
        self.measurements: list[Measurement] = []
        self.starts: list[ServerStart] = []
        self.targets: list[targets.Target] = []
        self.notes: list[str] = []
        self.in_process_parts: dict[str, dict[str, float]] = {}
        self.in_process_parts_other_cpu_cores = 0.0
        #: sessions per request -> the timed copy of Merlin's executor model: p50 and breakdown
        self.merlin_breakdown: dict[str, dict] = {}
        self.tritonserver_version: str | None = None
        self.compiled: dict = {}
        self.began = time.perf_counter()

    # ---- the run ------------------------------------------------------------------------------

    def run(self) -> None:
        progress = self.progress
        progress.step(
            f"mode {self.mode.name}: building the example (clicks, workflow, a short training)"
        )
        self.workload = build_workload(
            self.work_dir / "example", session_counts=self.session_counts, progress=True
        )
        progress.step(
            f"trained in {self.workload.training_seconds:.1f} s; exporting the repositories"
        )
        if self.client_only:
            for system in self._prepare_client_repositories():
                self._measure_served(system)
            self.wall_s = time.perf_counter() - self.began
            self.targets = targets.client_targets(self.measurements)
            return
        ensemble, served, shared_repository = self._prepare_repositories()
        self._measure_in_process(ensemble)
        for system in served:
            self._measure_served(system)
        self._measure_shared(
            shared_repository, [system for system in served if system.key in ALONE.values()]
        )
        progress.step("the model's step compiled ahead of time against TorchScript, in-process")
        self.compiled = compiled.measure(self.workload, self.mode.part_repetitions, progress)
        self.wall_s = time.perf_counter() - self.began
        self.targets = targets.evaluate(self.measurements, self.starts, self.compiled)

    def write(self, output_dir: Path, stem: str) -> list[Path]:
        output_dir.mkdir(parents=True, exist_ok=True)
        run = self._run_record()
        paths = [output_dir / f"{stem}.{suffix}" for suffix in ("json", "md", "png")]
        report.write_json(paths[0], run, self.measurements, self.starts, self.targets)
        report.write_markdown(
            paths[1],
            run,
            self.measurements,
            self.starts,
            self.targets,
            compiled.markdown(self.compiled) if self.compiled else [],
        )
        if self.client_only:
            return paths[:2]
        report.write_chart(paths[2], self.measurements)
        return paths

    # ---- building -----------------------------------------------------------------------------

    def _prepare_repositories(self):
        workload = self.workload
        request_schema = workload.workflow.input_schema
        ensemble = systems.project_ensemble(workload)
        project_repository = self.work_dir / "project"
        exported = ensemble.export(project_repository, systems.PROJECT_MODEL, overwrite=True)
        project_steps = floor.ensemble_step_count(project_repository, systems.PROJECT_MODEL)
        mixed = systems.project_ensemble(workload, backend="pytorch")
        mixed_repository = self.work_dir / "mixed"
        mixed_exported = mixed.export(mixed_repository, systems.MIXED_MODEL, overwrite=True)
        libtorch = systems.project_ensemble(workload, backend="pytorch", workflow_backend="pytorch")
        libtorch_repository = self.work_dir / "libtorch"
        libtorch_exported = libtorch.export(
            libtorch_repository, systems.LIBTORCH_MODEL, overwrite=True
        )
        packaged = systems.project_ensemble(
            workload, backend="pytorch", workflow_backend="pytorch", compiled="package"
        )
        package_repository = self.work_dir / "package"
        self.progress.step("(g): exporting the all-libtorch graph compiled ahead of time")
        began = time.perf_counter()
        package_exported = packaged.export(
            package_repository, systems.PACKAGE_MODEL, overwrite=True
        )
        package_export_s = time.perf_counter() - began
        shared_repository = self.work_dir / "shared"
        ensemble.export(shared_repository, systems.PROJECT_MODEL, overwrite=True)
        mixed.export(shared_repository, systems.MIXED_MODEL, overwrite=True)
        self.notes.append(
            "(a) in-process limit: `Ensemble.transform(DataFrame)` with the LocalExecutor in the"
            " benchmark process (DataFrame to table, TransformWorkflow on the compiled fast path,"
            f" PredictPytorch, TopK({TOP_K}) leaving out seen and reserved ids, DecodeItemIds,"
            " table to DataFrame); one client is the benchmark's main thread, 8 clients are it and"
            " 7 more threads."
        )

        floor_repository = self.work_dir / "floor"
        floor.write_floor_repository(floor_repository, project_steps, request_schema)
        self.notes.append(
            f"(b) Triton floor: an ensemble of {project_steps} no-op python-backend model(s), as"
            " many steps as (c)'s exported ensemble schedules, taking the same request tensors and"
            " returning them; requests built as tensors before timing."
        )

        fused = "; ".join(f"{model}: {', '.join(ops)}" for model, ops in exported.fused.items())
        self.notes.append(
            f"(c) this project: the exported ensemble `{systems.PROJECT_MODEL}` with"
            f" {project_steps} step(s) ({fused}) on the python backend, exported with the default"
            " `ModelOptions()` (one instance, Triton warm-up configured, one torch thread per"
            " instance). `Client` is `merlin_torch_serving.Client.infer(DataFrame)` returning a"
            " DataFrame (what a user pays); `tritonclient, prebuilt` sends the same requests as"
            " tensors built before timing."
        )
        mixed_steps = "; ".join(
            f"{model}: {', '.join(ops)}" for model, ops in mixed_exported.fused.items()
        )
        self.notes.append(
            "(e) this project, mixed: the same graph exported with"
            f' `PredictPytorch(backend="pytorch")` as `{systems.MIXED_MODEL}` ({mixed_steps}): the'
            " workflow on the python backend, the model with TopK and DecodeItemIds compiled into"
            " one libtorch model on Triton's pytorch backend; same requests, same"
            " `ModelOptions()`, same server settings as (c)."
        )
        libtorch_steps = "; ".join(
            f"{model}: {', '.join(ops)}" for model, ops in libtorch_exported.fused.items()
        )
        self.notes.append(
            "(f) this project, all libtorch: the same graph exported with"
            ' `TransformWorkflow(workflow, backend="pytorch")` and'
            ' `PredictPytorch(backend="pytorch")`'
            f" as `{systems.LIBTORCH_MODEL}` ({libtorch_steps}): the workflow's TorchScript form,"
            " the model, TopK and DecodeItemIds in one libtorch model, served by a tritonserver"
            " whose backend folder holds Triton's pytorch backend alone (no python backend); same"
            " requests, same `ModelOptions()`."
        )
        package_steps = "; ".join(
            f"{model}: {', '.join(ops)}" for model, ops in package_exported.fused.items()
        )
        self.notes.append(
            "(g) this project, all libtorch, compiled ahead of time: the same graph as (f) with"
            ' `compiled="package"`, exported as'
            f" `{systems.PACKAGE_MODEL}` ({package_steps}): the workflow, the model, TopK and"
            " DecodeItemIds exported with torch.export and compiled by AOTInductor into one .pt2"
            " package (for this CPU, one thread), served by the same pytorch-only tritonserver"
            f" with the project's change to its backend; its export took {package_export_s:.0f} s"
            " (the compile itself, when its package is not in the cache yet, is most of it; see"
            " the section on the compiled step)."
        )
        self.notes.append(
            "(c) / (e) sharing a server: both exports loaded in one tritonserver, each sent"
            f" requests by its own client (`{SHARED_CLIENT}`, gRPC) at the same time for the whole"
            " time budget (the two timings start together), so the python stub's and libtorch's"
            " torch thread pools compete for the cores; each is compared with its own row served"
            " alone (targets)."
        )

        merlin_repository = self.work_dir / "merlin"
        # a fresh copy of the workflow: Merlin's export saves it, which repoints its vocabularies
        merlin_outputs = merlin_baseline.export_merlin_systems(
            features.load_workflow(workload.workflow_dir),
            workload.session_model,
            merlin_repository,
            top_k=TOP_K,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        self.merlin_timers = breakdown.add_executor_variant(
            merlin_repository, MERLIN_TIMED, keep_results=False, timers_dir=self.work_dir
        )
        self.merlin_outputs = merlin_outputs
        self.notes.append(
            "(d) Merlin Systems 23.08: `Ensemble(TransformWorkflow(workflow) >>"
            " PredictPyTorch(traced_model, ...))` on the same workflow and model, exported with"
            " Merlin's own `Ensemble.export`. "
            + merlin_baseline.SWAP_NOTE
            + f" The model is traced with Transformers4Rec's `top_k={TOP_K}`, so it also answers"
            " ten items per session (without leaving out seen or reserved ids, ids still"
            " encoded). Each request is converted with Merlin's `convert_df_to_triton_input` and"
            " sent with tritonclient, as `send_triton_request` does (minus its extra"
            " is-server-live call per request)."
        )
        self.notes.append(
            "Servers run one at a time; client threads and the server share the machine's cores. "
            "Each model has one instance (Merlin's default and this project's)."
        )

        served = [
            systems.ServedSystem(
                FLOOR,
                floor_repository,
                floor.FLOOR_MODEL,
                (systems.prebuilt_tritonclient(floor.FLOOR_MODEL, request_schema),),
            ),
            systems.project_system(
                PROJECT, project_repository, systems.PROJECT_MODEL, request_schema
            ),
            systems.project_system(
                MIXED, mixed_repository, systems.MIXED_MODEL, request_schema, asynchronous=True
            ),
            systems.project_system(
                LIBTORCH,
                libtorch_repository,
                systems.LIBTORCH_MODEL,
                request_schema,
                pytorch_backend_directory(),
                asynchronous=True,
            ),
            systems.project_system(
                PACKAGE,
                package_repository,
                systems.PACKAGE_MODEL,
                request_schema,
                pytorch_backend_directory(),
            ),
            systems.ServedSystem(
                MERLIN,
                merlin_repository,
                merlin_baseline.MERLIN_MODEL,
                (
                    systems.merlin_tritonclient(
                        merlin_baseline.MERLIN_MODEL, request_schema, merlin_outputs
                    ),
                ),
            ),
        ]
        return ensemble, served, shared_repository

    def _prepare_client_repositories(self) -> list[systems.ServedSystem]:
        """The mixed and all-libtorch exports, each measured through prebuilt tritonclient
        requests, ``Client`` and ``AsyncClient``."""
        request_schema = self.workload.workflow.input_schema
        exports = [
            (MIXED, systems.MIXED_MODEL, "python", None),
            (LIBTORCH, systems.LIBTORCH_MODEL, "pytorch", pytorch_backend_directory()),
        ]
        served = []
        for key, model, workflow_backend, backend_directory in exports:
            repository = self.work_dir / model
            systems.project_ensemble(
                self.workload, backend="pytorch", workflow_backend=workflow_backend
            ).export(repository, model, overwrite=True)
            served.append(
                systems.project_system(
                    key, repository, model, request_schema, backend_directory, asynchronous=True
                )
            )
        self.notes.append(
            "Only the clients' own cost: (e) and (f) as in `./run bench`, each measured through"
            " `tritonclient, prebuilt` (tensors built before timing), `Client` (DataFrame in and"
            " out, one client per thread) and `AsyncClient` (DataFrame in and out, awaited; the"
            " coroutines of a row share one client in one event loop)."
        )
        return served

    # ---- measuring ----------------------------------------------------------------------------

    def _measure_in_process(self, ensemble) -> None:
        self.progress.step("(a) in-process: timing each part of Ensemble.transform")
        with OtherCpuLoad() as other:
            for sessions in self.session_counts:
                requests = self.workload.requests[sessions]
                self.in_process_parts[str(sessions)] = inprocess.time_parts(
                    ensemble, requests, self.mode.part_repetitions, self.mode.time_budget_s
                )
        self.in_process_parts_other_cpu_cores = round(other.other_cores, 3)
        for sessions in self.session_counts:
            requests = self.workload.requests[sessions]
            for concurrency in self.concurrencies:

                def measure(
                    requests=requests, sessions=sessions, concurrency=concurrency
                ) -> Measurement:
                    with OtherCpuLoad() as other:
                        result = run_load(
                            lambda: inprocess.in_process_sender(ensemble, requests),
                            concurrency,
                            self.load,
                        )
                    return measurement_from_load(
                        IN_PROCESS,
                        IN_PROCESS,
                        "Ensemble.transform",
                        sessions,
                        concurrency,
                        result,
                        None,
                        other,
                        {},
                    )

                self._keep_least_disturbed(measure)

    def _measure_served(self, system: systems.ServedSystem) -> None:
        self.progress.step(f"{system.key}: starting tritonserver on {system.repository.name}/")
        launched = time.perf_counter()
        with TritonServer(
            system.repository,
            log_path=self.work_dir / f"{system.key}.log",
            start_timeout_s=self.server_start_timeout_s,
            backend_directory=system.backend_directory,
        ) as server:
            start = self._cold_start(system, server, launched, ready=time.perf_counter())
            self._bring_to_steady_state(system, server)
            if self.tritonserver_version is None:
                self.tritonserver_version = server_stats.server_version(server.http_url)
            for client in system.clients:
                for protocol in self.protocols:
                    for sessions in client.sessions or self.session_counts:
                        for concurrency in client.concurrencies or self.concurrencies:
                            self._measure_served_setting(
                                system, server, client, protocol, sessions, concurrency
                            )
            if any(client.asynchronous for client in system.clients):
                for protocol in self.protocols:
                    self._measure_interleaved(system, server, protocol)
            if system.key == MERLIN:
                self._measure_merlin_breakdown(server)
        start.steady_p50_ms = find(
            self.measurements,
            system.key,
            "grpc",
            min(self.session_counts),
            1,
            system.clients[0].name,
        ).p50_ms

    def _measure_merlin_breakdown(self, server) -> None:
        """Where (d)'s time goes: the same requests (one client, gRPC) to a copy of Merlin's
        executor model that times each operator (benchmarks/merlin_executor.py)."""
        path = systems.merlin_tritonclient(
            MERLIN_TIMED, self.workload.workflow.input_schema, self.merlin_outputs
        )
        for sessions in self.session_counts:
            self.progress.step(f"(d) with timers in its executor, {sessions} session(s)")
            requests = self.workload.requests[sessions]
            with OtherCpuLoad(lambda: _pids(server)) as other:
                result, split = breakdown.measure(
                    lambda requests=requests: path.make_sender(server.grpc_url, "grpc", requests),
                    1,
                    self.load,
                    http_url=server.http_url,
                    model=MERLIN_TIMED,
                    timers=self.merlin_timers,
                )
            self.merlin_breakdown[str(sessions)] = {
                "p50_ms": round(result.percentile_ms(50), 3),
                "requests": result.requests,
                "other_cpu_cores": round(other.other_cores, 3),
                **split,
            }

    def _measure_shared(self, repository: Path, exports: list[systems.ServedSystem]) -> None:
        """Both exports in one server, one client each at once, for every request size (gRPC)."""
        shared_key = {alone: shared_key for shared_key, alone in ALONE.items()}
        names = " and ".join(SYSTEM_LABELS[export.key] for export in exports)
        self.progress.step(f"{names} in one tritonserver on {repository.name}/")
        with TritonServer(
            repository,
            log_path=self.work_dir / "shared.log",
            start_timeout_s=self.server_start_timeout_s,
        ) as server:
            for export in exports:
                self._bring_to_steady_state(export, server)
            for sessions in self.session_counts:
                requests = self.workload.requests[sessions]

                def measure(requests=requests, sessions=sessions) -> list[Measurement]:
                    make_senders = {
                        export.key: functools.partial(
                            _client_path(export, SHARED_CLIENT).make_sender,
                            server.grpc_url,
                            "grpc",
                            requests,
                        )
                        for export in exports
                    }
                    with (
                        OtherCpuLoad(lambda: _pids(server)) as other,
                        PeakServerMemory(server.pid) as memory,
                    ):
                        results = shared.run_side_by_side(make_senders, self.load)
                    rss_mb = memory.peak_bytes / _MB
                    return [
                        measurement_from_load(
                            shared_key[key],
                            "grpc",
                            SHARED_CLIENT,
                            sessions,
                            1,
                            results[key],
                            rss_mb,
                            other,
                            {},
                        )
                        for key in make_senders
                    ]

                self._keep_least_disturbed(measure)

    def _cold_start(
        self, system: systems.ServedSystem, server, launched: float, ready: float
    ) -> ServerStart:
        """The first COLD_REQUESTS requests after ready, one at a time, over gRPC with the
        system's first client path and the smallest requests."""
        rss_after_ready = server_rss_bytes(server.pid)
        send = system.clients[0].make_sender(
            server.grpc_url, "grpc", self.workload.requests[min(self.session_counts)]
        )

        def timed(index: int) -> tuple[float, float]:
            """When request ``index`` was answered, and its latency in ms."""
            began = time.perf_counter()
            send(index)
            answered = time.perf_counter()
            return answered, round((answered - began) * 1000.0, 3)

        with OtherCpuLoad(lambda: _pids(server)) as other:
            answered, first_ms = timed(0)
            first_requests_ms = [first_ms] + [timed(index)[1] for index in range(1, COLD_REQUESTS)]
        start = ServerStart(
            system=system.key,
            models=sorted(model.name for model in server.models()),
            ensemble_steps=_steps_or_none(system),
            start_to_ready_s=round(ready - launched, 3),
            start_to_first_answer_s=round(answered - launched, 3),
            first_request_ms=first_ms,
            first_requests_ms=first_requests_ms,
            rss_after_ready_mb=round(rss_after_ready / _MB, 1),
            other_cpu_cores=round(other.other_cores, 3),
        )
        self.starts.append(start)
        self.progress.step(
            f"{system.key}: ready after {start.start_to_ready_s:.1f} s, first answer after"
            f" {start.start_to_first_answer_s:.1f} s; first {COLD_REQUESTS} requests (ms):"
            f" {', '.join(f'{ms:.0f}' for ms in first_requests_ms)}; RSS"
            f" {start.rss_after_ready_mb:.0f} MB"
        )
        return start

    def _bring_to_steady_state(self, system: systems.ServedSystem, server) -> None:
        """Send every request of every setting STEADY_STATE_PASSES times, one at a time.

        Measurements should see a server that has been serving for a while, as the cold-start
        table shows the server that has not: whatever warms up per input shape (TorchScript's
        optimizing executor re-specialises a model for each new shape, for dozens of requests)
        has then met every shape of the benchmark.
        """
        for sessions in self.session_counts:
            requests = self.workload.requests[sessions]
            send = system.clients[0].make_sender(server.grpc_url, "grpc", requests)
            for index in range(STEADY_STATE_PASSES * len(requests)):
                send(index)

    def _measure_served_setting(
        self, system, server, client, protocol: str, sessions: int, concurrency: int
    ) -> None:
        url = server.grpc_url if protocol == "grpc" else server.http_url
        requests = self.workload.requests[sessions]
        statistics = {}

        def snapshot_statistics() -> None:
            statistics["before"] = server_stats.snapshot(server.http_url)

        def measure() -> Measurement:
            with (
                OtherCpuLoad(lambda: _pids(server)) as other,
                PeakServerMemory(server.pid) as memory,
            ):
                load = async_load.run_async_load if client.asynchronous else run_load
                result = load(
                    lambda: client.make_sender(url, protocol, requests),
                    concurrency,
                    self.load,
                    on_timing_start=snapshot_statistics,
                )
            server_side = server_stats.per_request_ms(
                statistics["before"], server_stats.snapshot(server.http_url)
            )
            rss_mb = memory.peak_bytes / _MB
            return measurement_from_load(
                system.key,
                protocol,
                client.name,
                sessions,
                concurrency,
                result,
                rss_mb,
                other,
                server_side,
            )

        self._keep_least_disturbed(measure)

    def _measure_interleaved(self, system: systems.ServedSystem, server, protocol: str) -> None:
        """One session per request through each client path in turn (see ``interleaved``)."""
        url = server.grpc_url if protocol == "grpc" else server.http_url

        def measure() -> list[Measurement]:
            with OtherCpuLoad(lambda: _pids(server)) as other:
                results = interleaved.interleaved(
                    system.clients, url, protocol, self.workload.requests[1], self.load
                )
            return [
                measurement_from_load(
                    system.key, protocol, name + interleaved.SUFFIX, 1, 1, result, None, other, {}
                )
                for name, result in results.items()
            ]

        self._keep_least_disturbed(measure)

    def _keep_least_disturbed(self, measure: Callable[[], Measurement | list[Measurement]]) -> None:
        """Measure; while other processes or virtual machines took the CPU, pause and measure
        again (up to BUSY_RETRIES times), then keep the attempt they disturbed least. An attempt
        may measure several settings at once (a list), which are kept or dropped together."""

        def attempt() -> list[Measurement]:
            measured = measure()
            return measured if isinstance(measured, list) else [measured]

        def disturbance(measured: list[Measurement]) -> float:
            return max(m.other_cpu_cores for m in measured)

        attempts = [attempt()]
        while disturbance(attempts[-1]) > BUSY_MACHINE_CORES and len(attempts) <= BUSY_RETRIES:
            self.progress.step(
                f"other processes or virtual machines took {disturbance(attempts[-1]):.2f} cores; "
                f"measuring again in {BUSY_PAUSE_S:g} s"
            )
            time.sleep(BUSY_PAUSE_S)
            attempts.append(attempt())
        kept = min(attempts, key=disturbance)
        for measurement in kept:
            measurement.attempts = len(attempts)
            self.measurements.append(measurement)
            self.progress.measured(measurement)

    # ---- the record -----------------------------------------------------------------------------

    def _run_record(self) -> dict:
        workflow = self.workload.workflow
        catalog = int(workflow.output_schema["item_id-list"].properties["domain"]["max"]) + 1
        return {
            "environment": self.environment,
            "tritonserver_version": self.tritonserver_version,
            "settings": {
                "mode": self.mode.name,
                "warmup_requests": self.mode.warmup_requests,
                "timed_requests": self.mode.timed_requests,
                "time_budget_s": self.mode.time_budget_s,
                "in_process_part_repetitions": self.mode.part_repetitions,
                "cold_requests": COLD_REQUESTS,
                "steady_state_passes": STEADY_STATE_PASSES,
                "session_counts": list(self.session_counts),
                "concurrencies": list(self.concurrencies),
                "protocols": list(self.protocols),
                "client_only": self.client_only,
            },
            "workload": {
                "train_sessions": self.workload.n_train_sessions,
                "catalog": catalog,
                "epochs": self.workload.epochs,
                "training_s": round(self.workload.training_seconds, 1),
                "max_sequence_length": MAX_SEQUENCE_LENGTH,
                "top_k": TOP_K,
                "requests_per_setting": {
                    str(n): len(frames) for n, frames in self.workload.requests.items()
                },
                "rows_per_request_mean": {
                    str(n): round(sum(len(f) for f in frames) / len(frames), 1)
                    for n, frames in self.workload.requests.items()
                },
            },
            "in_process_parts": self.in_process_parts,
            "compiled_step": self.compiled,
            "in_process_parts_other_cpu_cores": self.in_process_parts_other_cpu_cores,
            "merlin_breakdown": self.merlin_breakdown,
            "notes": self.notes,
            "wall_s": round(self.wall_s, 1),
        }


def _client_path(system: systems.ServedSystem, name: str) -> systems.ClientPath:
    return next(client for client in system.clients if client.name == name)


def _pids(server: TritonServer) -> list[int]:
    return [process.pid for process in server_processes(server.pid)]


def _steps_or_none(system: systems.ServedSystem) -> int | None:
    try:
        return floor.ensemble_step_count(system.repository, system.model)
    except ValueError:  # Merlin's executor_model is one python model, not a Triton ensemble
        return None
