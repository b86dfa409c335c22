"""What the eager Transformers4Rec model answers for a request, computed without the library.

NVTabular's own ``workflow.transform`` on the raw rows (clicks that share a timestamp in the
request's order, as the library documents), each list padded on the right to the model's 20 as
training padded it, the eager model, then (for a model scoring the whole catalog)
the top k with the reserved ids and the session's own items left out, and raw ids read from the
vocabulary file. Sessions the workflow filters out have no reference row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from tests.fastpath.helpers import nvtabular_transform
from tests.official import training
from tests.official.example import TOP_K, Example
from tests.session_models import masked_top_k


def eager_answer(example: Example, rows: pd.DataFrame) -> pd.DataFrame:
    """Per kept session (indexed by session id): ``item_ids``, ``item_scores`` and ``all_scores``
    (the catalog's scores, for judging near ties; None when the model ranks itself)."""
    sessions = _nvtabular_sessions(example, rows)
    if sessions.empty:
        return pd.DataFrame(columns=["item_ids", "item_scores", "all_scores"])
    inputs = training.padded(
        sessions, example.module.MODEL_COLUMNS, example.module.SESSIONS_MAX_LENGTH
    )
    with torch.no_grad():
        output = example.model(inputs)
    if example.has_top_k:
        scores, ids = (tensor.numpy() for tensor in output)
        return pd.DataFrame(
            {"item_ids": list(ids), "item_scores": list(scores), "all_scores": [None] * len(ids)},
            index=sessions["session_id"].to_numpy(),
        )
    scores = output.numpy()
    encoded = masked_top_k(scores, sessions["item_id-list"], TOP_K)
    return pd.DataFrame(
        {
            "item_ids": list(_raw_item_ids(example)[encoded]),
            "item_scores": list(np.take_along_axis(scores, encoded, axis=1)),
            "all_scores": list(scores),
        },
        index=sessions["session_id"].to_numpy(),
    )


def _nvtabular_sessions(example: Example, rows: pd.DataFrame) -> pd.DataFrame:
    raw = rows[example.workflow.input_schema.column_names].reset_index(drop=True)
    if raw.groupby("session_id").size().max() < example.module.MINIMUM_SESSION_LENGTH:
        # the Filter keeps no session, and NVTabular fails on what follows it
        return pd.DataFrame(columns=example.workflow.output_schema.column_names)
    return nvtabular_transform(example.workflow, raw)


def _raw_item_ids(example: Example) -> np.ndarray:
    """Raw item id by encoded id, -1 for the reserved ids, from the vocabulary NVTabular wrote."""
    path = example.workflow.output_schema["item_id-list"].properties["cat_path"]
    vocabulary = pd.read_parquet(path)
    raw = np.full(int(vocabulary.index.max()) + 1, -1, dtype=np.int64)
    raw[vocabulary.index.to_numpy()] = vocabulary["item_id"].to_numpy()
    return raw
