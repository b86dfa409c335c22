"""The NVTabular workflow of the ranking example: row in, row out (no grouping), the way ranking
features usually are.

Categorical ids and the device are encoded with ``Categorify`` (unseen values share one
out-of-vocabulary id, missing ones the null id); continuous features have their missing values
filled with 0 (``FillMissing``) and are then standardised with the training mean and deviation
(``Normalize``). The label is not part of the workflow: serving has no label.
"""

from __future__ import annotations

from pathlib import Path

import nvtabular as nvt
import pandas as pd
from merlin.io import Dataset

from examples.ranking.data import CATEGORICAL_COLUMNS, CONTINUOUS_COLUMNS


def build_workflow(directory: str | Path) -> nvt.Workflow:
    """The unfitted workflow; fitting writes the vocabularies under ``directory``."""
    categorical = list(CATEGORICAL_COLUMNS) >> nvt.ops.Categorify(out_path=str(directory))
    continuous = (
        list(CONTINUOUS_COLUMNS) >> nvt.ops.FillMissing(fill_val=0.0) >> nvt.ops.Normalize()
    )
    return nvt.Workflow(categorical + continuous)


def fit_workflow(train: pd.DataFrame, directory: str | Path) -> nvt.Workflow:
    """Fit on the training rows and save the workflow (with its vocabularies) in ``directory``."""
    directory = Path(directory)
    workflow = build_workflow(directory)
    workflow.fit(Dataset(train[list(CATEGORICAL_COLUMNS + CONTINUOUS_COLUMNS)], cpu=True))
    workflow.save(str(directory / "workflow"))
    return workflow


def transform(workflow: nvt.Workflow, rows: pd.DataFrame) -> pd.DataFrame:
    """The model's input features of ``rows``, one output row per input row, in order."""
    return (
        workflow.transform(Dataset(rows[workflow.input_schema.column_names], cpu=True))
        .to_ddf()
        .compute()
    )
