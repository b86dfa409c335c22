"""What runs on a Dask worker: the exported ensemble, loaded once per worker process, and the
scoring of one partition into its part file.

Tasks carry only a ``ScoringJob`` (paths, names, digests, counts): the ensemble is never pickled
into the task graph. Each worker process loads it from the repository's files the first time a
task needs it (or when ``preload`` asks), checked against the manifest and against the digest the
run began with, and keeps it for every later task of the run.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from merlin_torch_serving import chunks, frames, tables
from merlin_torch_serving.exceptions import MerlinTorchServingError, ScoringError
from merlin_torch_serving.scoring.answers import arrow_answer, empty_answer
from merlin_torch_serving.scoring.exported import ExportedEnsemble
from merlin_torch_serving.scoring.inputs import in_place_order
from merlin_torch_serving.scoring.output import write_part

#: ensembles one worker process keeps loaded (a long-lived cluster may score several in turn)
_KEPT_ENSEMBLES = 2
_lock = threading.Lock()
_ensembles: OrderedDict[tuple[str, str, str], ExportedEnsemble] = OrderedDict()
_loads = 0


@dataclass(frozen=True)
class ScoringJob:
    """Everything a task needs besides its rows: small, and the same for every task of a run."""

    repository: str
    ensemble: str
    export_digest: str
    run_key: str
    output: str
    session_columns: tuple[str, ...]
    batch_rows: int
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
        request = frames.frame_to_table(
            in_place_order(partition, list(job.session_columns)), ensemble.input_schema
        )
        batches = chunks.split(request, list(job.session_columns), job.batch_rows)
        answers = [ensemble.run(batch) for batch in batches if tables.num_rows(batch)]
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
