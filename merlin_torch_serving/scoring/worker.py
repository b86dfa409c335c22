"""What runs on a Dask worker: the exported ensemble, loaded once per worker process, and the
scoring of one partition into its part file.

Tasks carry only a ``ScoringJob`` (paths, names, digests, counts): the ensemble is never pickled
into the task graph. Each worker process loads it from the repository's files the first time a
task needs it (or when ``preload`` asks), checked against the manifest and against the digest the
run began with, and keeps it for every later task of the run.

A worker process started by a Dask nanny has ``MALLOC_TRIM_THRESHOLD_=65536`` (distributed's
default), with which glibc returns every large buffer to the system as soon as it is freed and
the model faults it in again on its next run: scoring ran 1.5 to 3 times slower in such a worker
than in a plain process. Loading the first ensemble lets the process keep freed memory for reuse
instead (``keep_freed_memory``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from merlin_torch_serving.data import frames, tables
from merlin_torch_serving.exceptions import MerlinTorchServingError, ScoringError
from merlin_torch_serving.scoring.answers import arrow_answer, empty_answer
from merlin_torch_serving.scoring.exported import ExportedEnsemble
from merlin_torch_serving.scoring.inputs import in_place_order, session_batches
from merlin_torch_serving.scoring.output import write_part

#: ensembles one worker process keeps loaded (a long-lived cluster may score several in turn)
_KEPT_ENSEMBLES = 2
_lock = threading.Lock()
_ensembles: OrderedDict[tuple[str, str, str], ExportedEnsemble] = OrderedDict()
_loads = 0
#: glibc's mallopt parameters (malloc.h) and what a scoring worker sets them to: the largest
#: allocation served from the heap (glibc's own ceiling when it adapts the threshold itself), and
#: how much free memory at the heap's top is kept before it is returned
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES = 32 << 20
_TRIM_THRESHOLD_BYTES = 64 << 20


@dataclass(frozen=True)
class ScoringJob:
    """Everything a task needs besides its rows: small, and the same for every task of a run."""

    repository: str
    ensemble: str
    export_digest: str
    run_key: str
    output: str
    session_columns: tuple[str, ...]
    batch_sessions: int
    max_request_rows: int | None
    #: the answer's column names for the caller (a mapped input, such as the session id)
    renamed: tuple[tuple[str, str], ...] = ()


def loaded_ensemble(repository: str, name: str, digest: str) -> ExportedEnsemble:
    """Ensemble ``name`` of ``repository`` as loaded in this process, loading it the first time;
    a ``ScoringError`` when its files differ from the export the run began with."""
    global _loads
    key = (repository, name, digest)
    with _lock:
        if key in _ensembles:
            _ensembles.move_to_end(key)
            return _ensembles[key]
        if _loads == 0:
            keep_freed_memory()
        ensemble = ExportedEnsemble(repository, name)
        if ensemble.digest != digest:
            raise ScoringError(
                f"score it again from the start: ensemble {name!r} of {repository!r} changed"
                f" while it was being scored (export digest {ensemble.digest[:12]}... on this"
                f" worker, {digest[:12]}... when the run began)"
            )
        _ensembles[key] = ensemble
        _loads += 1
        while len(_ensembles) > _KEPT_ENSEMBLES:
            _ensembles.popitem(last=False)
        return ensemble


def keep_freed_memory() -> bool:
    """Have this process's allocator keep freed memory for reuse (up to the thresholds above), as
    glibc does by default; whether it could (glibc only)."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
    )


def preload(job: ScoringJob) -> None:
    """Load the job's ensemble in this worker process now (``Client.run``), so that a repository a
    worker cannot read fails the run before any partition is scored."""
    loaded_ensemble(job.repository, job.ensemble, job.export_digest)


def loads() -> int:
    """How many ensembles this process has loaded (each worker loads a run's ensemble once)."""
    return _loads


def score_partition(partition: pd.DataFrame, number: int, job: ScoringJob) -> dict:
    """Score one partition of whole sessions (a ``placed`` frame) and write its part file; returns
    what the part holds."""
    started = time.perf_counter()
    try:
        ensemble = loaded_ensemble(job.repository, job.ensemble, job.export_digest)
        keys = list(job.session_columns)
        request = frames.frame_to_table(in_place_order(partition, keys), ensemble.input_schema)
        batches = session_batches(request, keys, job.batch_sessions, job.max_request_rows)
        answers = [ensemble.run(batch) for batch in batches]
        renamed = dict(job.renamed)
        answer = (
            arrow_answer(tables.concat(answers), ensemble.output_schema, renamed)
            if answers
            else empty_answer(ensemble.output_schema, renamed)
        )
        facts = {"run": job.run_key, "sessions": answer.num_rows, "rows": len(partition)}
        write_part(Path(job.output), number, answer, facts)
    except MerlinTorchServingError:
        raise
    except Exception as error:
        raise ScoringError(
            f"partition {number} could not be scored: {type(error).__name__}: {error}"
        ) from error
    return {**facts, "partition": number, "seconds": time.perf_counter() - started}
