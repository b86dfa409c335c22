"""``score_dataset``: every session of a dataset answered by an exported ensemble on a Dask cluster,
written as parquet, one row per session with the columns a server answers.

The run, from the caller's process: check the export against its manifest (an in-memory
``Ensemble`` is exported first, into the output folder) -> read the input and take its digest ->
record the run in the output folder, keeping the parts an earlier run of the same export and input
wrote -> load the ensemble once on every worker -> cut the rest into partitions of whole sessions
(``inputs``; an ensemble that answers rows one by one keeps the input's partitions) -> score each
partition into its part file on the workers (``worker``), reporting progress as parts complete.
A worker that dies takes its tasks with it; the scheduler runs them again elsewhere, and each part
is written whole or not at all.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from merlin_torch_serving.exceptions import ScoringError
from merlin_torch_serving.scoring import inputs, output
from merlin_torch_serving.scoring.exported import read_export
from merlin_torch_serving.scoring.sizes import DEFAULT_BATCH_SESSIONS, DEFAULT_PARTITION_ROWS
from merlin_torch_serving.scoring.worker import ScoringJob, preload, score_partition


@dataclass(frozen=True)
class ScoringProgress:
    """How far a run has got: once before it scores, then after each partition it scores."""

    partitions: int
    done: int  # partitions written, by this run or (``skipped``) an earlier one
    skipped: int
    sessions: int  # answer rows written by this run
    rows: int  # input rows (clicks) scored by this run
    elapsed_s: float

    @property
    def sessions_per_s(self) -> float:
        return self.sessions / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        kept = f", {self.skipped} kept from an earlier run" if self.skipped else ""
        if self.done == self.skipped:  # nothing scored yet
            return f"{self.partitions - self.done} of {self.partitions} partitions to score{kept}"
        return (
            f"scored {self.done}/{self.partitions} partitions{kept}: {self.sessions:,} sessions"
            f" ({self.rows:,} rows) in {self.elapsed_s:.1f} s, {self.sessions_per_s:,.0f}"
            " sessions/s"
        )


@dataclass(frozen=True)
class ScoringResult:
    """What a run wrote into ``output``: one part file per partition."""

    output: str
    repository: str
    ensemble: str
    export_digest: str
    partitions: int
    scored: int  # partitions scored by this run
    skipped: int  # partitions an earlier run of the same export and input had written
    sessions: int  # answer rows in the whole output
    seconds: float  # the whole call: export, input digest, scoring
    sessions_per_s: float  # of this run's partitions, from its first task to its last part


Progress = Callable[[ScoringProgress], None]
#: where a local cluster listens: this machine only
LOOPBACK_HOST = "127.0.0.1"
_PROGRESS_INTERVAL_S = 1.0


def score_dataset(
    model,
    data,
    output_dir: str | os.PathLike,
    *,
    name: str | None = None,
    client=None,
    workers: int | None = None,
    columns: Mapping[str, str] | None = None,
    partition_rows: int = DEFAULT_PARTITION_ROWS,
    batch_sessions: int = DEFAULT_BATCH_SESSIONS,
    overwrite: bool = False,
    progress: Progress | bool = True,
) -> ScoringResult:
    """Score every session of ``data`` with ``model`` on a Dask cluster and write the answers as
    parquet files into ``output_dir``.

    Parameters
    ----------
    model
        A repository folder written by ``Ensemble.export`` (``name`` picks the ensemble when it
        holds several), or an ``Ensemble``, exported first into ``output_dir/_repository``.
    data
        The raw rows: a ``merlin.io.Dataset``, a Dask or pandas DataFrame, or a folder, file or
        glob of parquet files, with the ensemble's input columns (``columns`` maps other names:
        ``{"user_session": "session_id"}``). A session's rows may be spread over any partitions.
    client
        A ``distributed.Client`` or a scheduler address; None starts a local cluster of
        ``workers`` processes (default: one per core), one thread each, stopped at the end,
        listening on loopback only (its dashboards too). To watch a run from elsewhere, start a
        cluster of your own (``dask scheduler --host ...``) and pass its address.
    partition_rows
        About how many rows (clicks) one partition, and so one part file, holds.
    batch_sessions
        Sessions per run of the ensemble within a partition (fewer when they have more rows than
        the export takes in one request).
    overwrite
        Replace the answers of another run (another export, input or partitioning) found in
        ``output_dir``; without it they are refused. Answers of the same run are always kept:
        a rerun scores only the partitions missing. A folder holding anything scoring does not
        write (hidden files aside) is refused either way, naming it: the answers would be read
        back mixed with it.
    progress
        True prints how far it has got on stderr (a line a second at most, and the last one),
        False nothing; or a function called with a ``ScoringProgress`` before the first partition
        and after each.
    """
    for label, value in (
        ("partition_rows", partition_rows),
        ("batch_sessions", batch_sessions),
        ("workers", 1 if workers is None else workers),
    ):
        if value < 1:
            raise ValueError(f"{label} must be at least 1, got {value!r}")
    if client is not None and workers is not None:
        raise ValueError(
            "pass workers= (for a local cluster) or client= (a cluster of your own), not both"
        )
    if client is None:
        _check_spawnable()
    began = time.perf_counter()
    folder = Path(output_dir).absolute()
    output.refuse_foreign_files(folder)  # before an Ensemble is exported into it
    repository, name = _repository(model, name, folder, overwrite)
    export = read_export(repository, name)
    schemas = export.schemas
    session_columns = _session_columns(export.name, schemas)
    report = _reporter(progress)
    # read (lazily) before a cluster starts: a missing column or a broken file fails at once
    frame = inputs.input_frame(data, schemas.input_schema, columns, partition_rows)
    with _cluster(client, workers) as dask_client:
        placed = inputs.placed(frame, schemas.input_schema)
        # rows answered one by one keep the input's partitions, so its cut is part of the input
        rows, digest = inputs.input_digest(placed, dask_client.get, cut=not session_columns)
        record = output.RunRecord(
            ensemble=export.name,
            repository=str(export.repository),
            export_digest=export.digest,
            input_rows=rows,
            input_digest=digest,
            partitions=(
                inputs.partition_count(rows, partition_rows)
                if session_columns
                else placed.npartitions
            ),
            session_columns=session_columns,
        )
        output.start_run(folder, record, overwrite=overwrite)
        kept = output.done_parts(folder, record)
        job = ScoringJob(
            repository=str(export.repository),
            ensemble=export.name,
            export_digest=export.digest,
            run_key=record.key,
            output=str(folder),
            session_columns=tuple(session_columns),
            batch_sessions=batch_sessions,
            max_request_rows=schemas.max_request_rows,
            renamed=tuple((theirs, yours) for yours, theirs in (columns or {}).items()),
        )
        written, scoring_s = _score(dask_client, placed, record, job, kept, report)
    scored_sessions = sum(part["sessions"] for part in written)
    return ScoringResult(
        output=str(folder),
        repository=str(export.repository),
        ensemble=export.name,
        export_digest=export.digest,
        partitions=record.partitions,
        scored=len(written),
        skipped=len(kept),
        sessions=scored_sessions + sum(part["sessions"] for part in kept.values()),
        seconds=time.perf_counter() - began,
        sessions_per_s=scored_sessions / scoring_s if scoring_s > 0 else 0.0,
    )


def _score(
    dask_client, placed, record, job: ScoringJob, kept: dict, report
) -> tuple[list[dict], float]:
    """Score the partitions not ``kept``; what each part holds, and the seconds they took."""
    from dask import delayed
    from distributed import as_completed

    remaining = [number for number in range(record.partitions) if number not in kept]
    started = time.perf_counter()
    state = ScoringProgress(record.partitions, len(kept), len(kept), 0, 0, 0.0)
    report(state)
    if not remaining:
        return [], 0.0
    dask_client.run(preload, job)
    if record.session_columns:
        placed = inputs.by_session(placed, record.session_columns, record.partitions)
    parts = placed.to_delayed()
    tasks = [delayed(score_partition, pure=True)(parts[n], n, job) for n in remaining]
    futures = dask_client.compute(tasks)
    written = []
    try:
        for future in as_completed(futures):
            part = future.result()
            written.append(part)
            state = ScoringProgress(
                record.partitions,
                state.done + 1,
                state.skipped,
                state.sessions + part["sessions"],
                state.rows + part["rows"],
                time.perf_counter() - started,
            )
            report(state)
    finally:
        dask_client.cancel(futures)
    output.remove_leftovers(Path(job.output))  # every part is written: none is being written
    return written, state.elapsed_s


def _repository(model, name: str | None, folder: Path, overwrite: bool) -> tuple[Path, str | None]:
    """The repository to score and the ensemble's name in it: ``model`` itself, or the folder an
    ``Ensemble`` is exported into."""
    from merlin_torch_serving.graph.ensemble import Ensemble

    if not isinstance(model, Ensemble):
        if not isinstance(model, str | os.PathLike):
            raise TypeError(
                "score an Ensemble or the folder Ensemble.export wrote into, not a"
                f" {type(model).__name__}"
            )
        return Path(model), name
    exported = folder / output.REPOSITORY_DIR
    previous = output.read_record(folder)
    if previous is not None and Path(previous.repository) == exported and not overwrite:
        raise ScoringError(
            f"resume it with score_dataset({str(exported)!r}, ...), the export it scores, or pass"
            f" overwrite=True to score this ensemble anew: {str(folder)!r} holds a run of an"
            " ensemble exported there"
        )
    name = name or "ensemble"
    model.export(exported, name, overwrite=True)
    return exported, name


def _session_columns(name: str, schemas) -> list[str]:
    """The columns that keep rows together (the session id), by which the input is partitioned;
    [] when rows are answered one by one (a ranking model): then each input partition is scored as
    it is."""
    groups = schemas.request_groups
    if groups is None:
        raise ScoringError(
            f"score it with Ensemble.transform on all rows at once: ensemble {name!r} does not say"
            " which input columns keep rows together (a workflow that groups by a column it"
            " computes, or an operator that must see the whole request), so its input cannot be"
            " cut into partitions"
        )
    return list(groups)


@contextlib.contextmanager
def _cluster(client, workers: int | None):
    """The ``distributed.Client`` to run on: the caller's, one for a scheduler address, or one for
    a local cluster of ``workers`` single-threaded processes."""
    from distributed import Client, LocalCluster

    if isinstance(client, Client):
        yield client
        return
    if client is not None:
        with Client(client) as connected:
            yield connected
        return
    environment = dict(os.environ)
    try:
        with (
            LocalCluster(
                n_workers=workers or os.cpu_count() or 1,
                threads_per_worker=1,
                processes=True,
                # every socket on loopback, on a free port (8787 may be another cluster's): the
                # scheduler's and the workers' HTTP servers (dashboard, /info, /metrics) answer
                # without credentials, so nothing of the cluster listens beyond this machine
                host=LOOPBACK_HOST,
                dashboard_address=f"{LOOPBACK_HOST}:0",
                worker_dashboard_address=f"{LOOPBACK_HOST}:0",
            ) as cluster,
            Client(cluster) as local,
        ):
            yield local
    finally:
        # the cluster's nannies set their workers' variables (OMP_NUM_THREADS=1, ...) in this
        # process's environment, where processes started later would inherit them
        os.environ.clear()
        os.environ.update(environment)


def _check_spawnable() -> None:
    """A ``ScoringError`` when the local cluster's worker processes could not start: they import
    the main module from its file, and a script read from standard input has none (they would
    fail and be restarted without end)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is None and path is not None and not os.path.isfile(path):
        raise ScoringError(
            "run the code from a file, in an interactive session, or pass client= (a cluster of"
            " your own): a local cluster's worker processes import the main module, and"
            f" {path!r} is not a file they can import"
        )


def _reporter(progress: Progress | bool) -> Progress:
    if callable(progress):
        return progress
    if not progress:
        return lambda state: None
    printed = [-float("inf")]

    def show(state: ScoringProgress) -> None:
        # a line a second at most (a run may have thousands of partitions), and the last one
        now = time.monotonic()
        if now - printed[0] >= _PROGRESS_INTERVAL_S or state.done == state.partitions:
            printed[0] = now
            print(state.line(), file=sys.stderr, flush=True)

    return show
