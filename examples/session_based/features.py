"""The NVTabular workflow that turns interaction rows into one row of item sequences per session,
and the helpers to fit, apply, save and load it.

The output lists stay ragged (no padding): each session keeps its last ``max_sequence_length``
clicks, and whoever feeds a model pads them.
"""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import nvtabular as nvt
import pandas as pd
from merlin.dag import Graph
from merlin.io import Dataset
from merlin.schema import Tags

from examples.session_based.data import read_interactions, validate_interactions

ITEM_LIST_COLUMN = "item_id-list"
CATEGORY_LIST_COLUMN = "category-list"
SESSION_LENGTH_COLUMN = "item_id-count"
SESSION_START_COLUMN = "timestamp-first"

# Categorify (nvtabular 23.08) reserves the first encoded ids: 0 is padding, 1 null, 2 out of
# vocabulary. Values seen during fit are encoded from 3 on.
PADDING_ID = 0
NULL_ID = 1
OUT_OF_VOCABULARY_ID = 2
FIRST_ITEM_ID = 3


def build_workflow(*, directory: str | Path, max_sequence_length: int = 20) -> nvt.Workflow:
    """The session workflow of Transformers4Rec's examples, with lists left ragged.

    ``directory`` is where fitting writes the item and category vocabularies (Categorify would
    otherwise write them into the current working directory).
    """
    if max_sequence_length < 1:
        raise ValueError(f"max_sequence_length must be at least 1, got {max_sequence_length!r}")
    encoded = ["item_id", "category"] >> nvt.ops.Categorify(out_path=str(directory))
    sessions = ["session_id", "timestamp"] + encoded >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={"item_id": ["list", "count"], "category": ["list"], "timestamp": ["first"]},
        name_sep="-",
    )
    # No pad=True: padding is the consumer's job, and ListSlice's float pad_value would turn
    # the int64 lists into floats on the CPU path.
    item_list = (
        sessions[ITEM_LIST_COLUMN]
        >> nvt.ops.ListSlice(-max_sequence_length)
        >> nvt.ops.AddMetadata(tags=[Tags.ITEM, Tags.ID, Tags.CATEGORICAL, Tags.LIST])
    )
    category_list = (
        sessions[CATEGORY_LIST_COLUMN]
        >> nvt.ops.ListSlice(-max_sequence_length)
        >> nvt.ops.AddMetadata(tags=[Tags.CATEGORICAL, Tags.LIST])
    )
    others = sessions["session_id", SESSION_LENGTH_COLUMN, SESSION_START_COLUMN]
    return nvt.Workflow(item_list + category_list + others)


def fit_workflow(
    train_interactions: Dataset | pd.DataFrame | str | Path,
    directory: str | Path,
    *,
    max_sequence_length: int = 20,
) -> nvt.Workflow:
    """Build the workflow, fit its vocabularies on the training interactions and save it.

    The returned workflow lives in ``directory`` (``workflow.save``), ready for
    ``load_workflow(directory)`` in another process.
    """
    directory = Path(directory)
    workflow = build_workflow(directory=directory, max_sequence_length=max_sequence_length)
    use_task_shuffle()
    workflow.fit(as_dataset(train_interactions))
    workflow.save(str(directory))
    return workflow


def use_task_shuffle() -> None:
    """Shuffle with dask's task-based method, here and on the workers of a Dask cluster.

    On a cluster, Categorify(split_out > 1) sorts its vocabularies with dask's default P2P
    shuffle, which fails on the pinned distributed ("shuffle_transfer failed"); the sort runs
    inside worker tasks, so the setting must reach the workers, not only this process.
    """
    _set_task_shuffle()
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):  # no cluster: dask picks tasks by itself
        return
    client.run(_set_task_shuffle)


def _set_task_shuffle() -> None:
    dask.config.set({"dataframe.shuffle.method": "tasks"})


def load_workflow(directory: str | Path) -> nvt.Workflow:
    directory = Path(directory)
    if not (directory / "workflow.pkl").exists():
        raise FileNotFoundError(
            f"{str(directory)!r} holds no saved workflow (no workflow.pkl); create one with"
            " fit_workflow()"
        )
    return nvt.Workflow.load(str(directory))


def as_dataset(interactions: Dataset | pd.DataFrame | str | Path) -> Dataset:
    """A CPU ``merlin.io.Dataset`` from a DataFrame, an interactions file or a Dataset."""
    if isinstance(interactions, Dataset):
        return interactions
    if isinstance(interactions, pd.DataFrame):
        return Dataset(validate_interactions(interactions), cpu=True)
    return Dataset(read_interactions(interactions), cpu=True)


def transform(
    workflow: nvt.Workflow, interactions: Dataset | pd.DataFrame | str | Path
) -> pd.DataFrame:
    """One row per session, ordered by session id; the list columns hold Python lists of ints."""
    sessions = workflow.transform(as_dataset(interactions)).to_ddf().compute()
    return sessions.sort_values("session_id").reset_index(drop=True)


def item_id_lookup(workflow: nvt.Workflow) -> np.ndarray:
    """Raw item id for each encoded item id (the array's index); reserved ids map to -1."""
    categorify = next(
        node.op for node in Graph.get_nodes_by_op_type([workflow.output_node], nvt.ops.Categorify)
    )
    vocabulary = pd.read_parquet(categorify.categories["item_id"])
    encoded = vocabulary.index.to_numpy()
    lookup = np.full(int(encoded.max()) + 1, -1, dtype=np.int64)
    known = encoded >= FIRST_ITEM_ID
    lookup[encoded[known]] = vocabulary["item_id"].to_numpy()[known]
    return lookup
