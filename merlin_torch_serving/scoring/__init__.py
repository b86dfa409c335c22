"""Batch scoring: every session of a dataset answered by an exported ensemble on a Dask cluster,
exactly as a server of that export answers it, written as parquet.

``dataset`` runs it; ``inputs`` cuts the input into partitions of whole sessions; ``worker`` scores
a partition on a worker with the ensemble ``exported`` loads (its ``steps`` called as Triton calls
them); ``answers`` and ``output`` write the parts. Names are imported on first use, so that the
command line can read ``sizes`` without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    "ExportedEnsemble": "merlin_torch_serving.scoring.exported",
    "ScoringProgress": "merlin_torch_serving.scoring.dataset",
    "ScoringResult": "merlin_torch_serving.scoring.dataset",
    "read_export": "merlin_torch_serving.scoring.exported",
    "score_dataset": "merlin_torch_serving.scoring.dataset",
}

__all__ = [
    "ExportedEnsemble",
    "ScoringProgress",
    "ScoringResult",
    "read_export",
    "score_dataset",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'merlin_torch_serving.scoring' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from merlin_torch_serving.scoring.dataset import ScoringProgress, ScoringResult, score_dataset
    from merlin_torch_serving.scoring.exported import ExportedEnsemble, read_export
