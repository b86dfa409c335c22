"""A small session-based setup for tests that must not need Transformers4Rec: raw interactions,
a fitted NVTabular workflow like Transformers4Rec's examples, and a TorchScript next-item model
whose scores depend on every item of the session (so padding and truncation errors show)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from merlin.schema import ColumnSchema, Schema, Tags

MAX_SEQUENCE_LENGTH = 5
N_ITEMS = 40


def interactions(n_sessions: int = 60, seed: int = 0, first_session: int = 1000) -> pd.DataFrame:
    """Raw rows: session_id, item_id (raw ids 500..), category, timestamp; sessions of 1-9 rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for session in range(first_session, first_session + n_sessions):
        length = int(rng.integers(1, 10))
        items = rng.integers(500, 500 + N_ITEMS, length)
        start = int(rng.integers(0, 10_000))
        for position, item in enumerate(items):
            rows.append((session, int(item), int(item) % 7, start + 10 * position))
    frame = pd.DataFrame(rows, columns=["session_id", "item_id", "category", "timestamp"])
    return frame.astype("int64")


def tied_interactions(
    n_sessions: int = 60, seed: int = 0, first_session: int = 1000
) -> pd.DataFrame:
    """``interactions`` where most clicks (about 90 %) share their timestamp with another click of
    their session, as on real data (MovieLens: 76 %): a session's clicks 30 s apart in groups
    instead of 10 s apart, and every third session's clicks all at one time."""
    rows = interactions(n_sessions, seed=seed, first_session=first_session)
    first = rows.groupby("session_id")["timestamp"].transform("min")
    coarse = rows["timestamp"] // 30 * 30
    rows["timestamp"] = coarse.where(rows["session_id"] % 3 != 0, first)
    return rows


def fitted_workflow(
    vocabulary_dir,
    train: pd.DataFrame | None = None,
    max_sequence_length: int = MAX_SEQUENCE_LENGTH,
    minimum_clicks: int | None = None,
):
    """Categorify -> Groupby(session, sorted by time) -> ListSlice, tagged for Transformers4Rec;
    with ``minimum_clicks``, then a Filter that keeps sessions of that many clicks or more.

    Categorify writes its vocabularies under ``vocabulary_dir``.
    """
    import nvtabular as nvt
    from merlin.io import Dataset

    train = interactions() if train is None else train
    categorical = ["item_id", "category"] >> nvt.ops.Categorify(out_path=str(vocabulary_dir))
    groupby = (["session_id", "timestamp"] + categorical) >> nvt.ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={"item_id": ["list", "count"], "category": ["list"], "timestamp": ["first"]},
        name_sep="-",
    )
    item_list = (
        groupby["item_id-list"]
        >> nvt.ops.ListSlice(-max_sequence_length)
        >> nvt.ops.AddMetadata(tags=[Tags.ITEM, Tags.ID, Tags.CATEGORICAL, Tags.LIST])
    )
    category_list = (
        groupby["category-list"]
        >> nvt.ops.ListSlice(-max_sequence_length)
        >> nvt.ops.AddMetadata(tags=[Tags.CATEGORICAL, Tags.LIST])
    )
    outputs = item_list + category_list + groupby["session_id", "item_id-count"]
    if minimum_clicks is not None:
        outputs = outputs >> nvt.ops.Filter(f=lambda df: df["item_id-count"] >= minimum_clicks)
    workflow = nvt.Workflow(outputs)
    workflow.fit(Dataset(train, cpu=True))
    return workflow


class PositionalSessionModel(torch.nn.Module):
    """Scores every catalog item from position-weighted item and category embeddings."""

    def __init__(self, catalog: int, categories: int, max_sequence_length: int, dim: int = 8):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.items = torch.nn.Parameter(torch.randn(catalog, dim, generator=generator))
        self.categories = torch.nn.Parameter(torch.randn(categories, dim, generator=generator))
        self.positions = torch.nn.Parameter(
            torch.randn(max_sequence_length, 1, generator=generator)
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        items = inputs["item_id-list"]
        mask = (items != 0).unsqueeze(-1).to(self.items.dtype)
        hidden = (self.items[items] + self.categories[inputs["category-list"]]) * mask
        session = (hidden * self.positions.unsqueeze(0)).sum(1)
        return session @ self.items.T


def eager_model(workflow, max_sequence_length: int = MAX_SEQUENCE_LENGTH) -> torch.nn.Module:
    """The model ``scripted_model`` scripts, eager (what torch.export compiles into a package)."""
    output = workflow.output_schema
    catalog = int(output["item_id-list"].properties["domain"]["max"]) + 1
    categories = int(output["category-list"].properties["domain"]["max"]) + 1
    return PositionalSessionModel(catalog, categories, max_sequence_length).eval()


def scripted_model(workflow, max_sequence_length: int = MAX_SEQUENCE_LENGTH):
    """The TorchScript model and its input/output schemas, sized from the workflow's domains."""
    output = workflow.output_schema
    catalog = int(output["item_id-list"].properties["domain"]["max"]) + 1
    categories = int(output["category-list"].properties["domain"]["max"]) + 1
    model = torch.jit.script(
        PositionalSessionModel(catalog, categories, max_sequence_length).eval()
    )
    input_schema = output.select_by_name(["item_id-list", "category-list"])
    output_schema = Schema([ColumnSchema("next-item", dtype="float32", dims=(None, catalog))])
    return model, input_schema, output_schema


def session_graph(workflow, model, backend: str = "python", k: int = 3):
    """raw rows >> TransformWorkflow >> PredictPytorch >> TopK (seen and reserved ids left out),
    with the session id beside the recommendations."""
    from merlin_torch_serving import PredictPytorch, TopK, TransformWorkflow

    scripted, input_schema, output_schema = model
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    top = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend=backend)
        >> TopK(k, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
    )
    return features["session_id"] + top
