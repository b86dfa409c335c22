"""The Transformers4Rec next-item model of the example: build it from the workflow's schema, train
it on CPU, measure recall@k on held-out sessions, save and load it.

Models take dense inputs: each list column as an int64 tensor ``[batch, max_sequence_length]``,
right-padded with 0, holding a session's last clicks in order (see ``padded_inputs``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np
import pandas as pd
import torch
import transformers4rec.torch as tr
from merlin.schema import Schema
from tqdm import tqdm
from transformers4rec.torch.masking import MaskedLanguageModeling

from examples.session_based.features import (
    CATEGORY_LIST_COLUMN,
    FIRST_ITEM_ID,
    ITEM_LIST_COLUMN,
    PADDING_ID,
)

MODEL_INPUT_COLUMNS = (ITEM_LIST_COLUMN, CATEGORY_LIST_COLUMN)
_MODEL_FILE_STEM = "t4rec_model_class"


def build_model(
    schema: Schema,
    *,
    max_sequence_length: int = 20,
    d_model: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    dropout: float = 0.0,
    mlm_probability: float = 0.3,
    seed: int = 0,
    n_items: int | None = None,
) -> tr.Model:
    """An XLNet next-item model (masked language modeling, tied item embeddings).

    ``schema`` is the workflow's output schema; the model reads the item and category lists.
    ``n_items`` sets the size of the item table (the catalog the model scores) when it should be
    larger than the workflow's vocabulary: a model of a million items, to measure serving, without
    data or training for a million items. The same seed gives the same initial weights. The dropout
    and masking rate differ from Transformers4Rec's defaults (0.3 and 0.15) because with those a
    small model learns too slowly to be trained in under a minute on CPU.
    """
    missing = [name for name in MODEL_INPUT_COLUMNS if name not in schema.column_names]
    if missing:
        raise ValueError(
            f"the schema has no column {missing[0]!r}: the model reads {list(MODEL_INPUT_COLUMNS)},"
            f" the schema has {schema.column_names}. Pass the output schema of the example's"
            " workflow"
        )
    input_schema = schema.select_by_name(list(MODEL_INPUT_COLUMNS))
    if n_items is not None:
        input_schema = with_item_catalog(input_schema, n_items)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        inputs = tr.TabularSequenceFeatures.from_schema(
            input_schema,
            max_sequence_length=max_sequence_length,
            aggregation="concat",
            d_output=d_model,
            masking=MaskedLanguageModeling(
                hidden_size=d_model, padding_idx=PADDING_ID, mlm_probability=mlm_probability
            ),
        )
        transformer_config = tr.XLNetConfig.build(
            d_model=d_model,
            n_head=n_heads,
            n_layer=n_layers,
            total_seq_length=max_sequence_length,
            dropout=dropout,
        )
        body = tr.SequentialBlock(
            inputs,
            tr.MLPBlock([d_model]),
            tr.TransformerBlock(transformer_config, masking=inputs.masking),
        )
        head = tr.Head(body, tr.NextItemPredictionTask(weight_tying=True), inputs=inputs)
        return tr.Model(head, max_sequence_length=max_sequence_length)


def with_item_catalog(schema: Schema, n_items: int) -> Schema:
    """``schema`` with the item list's ids ranging over ``n_items`` encoded ids (0 to n_items -
    1)."""

    def widened(column):
        domain = {**column.properties.get("domain", {}), "min": 0, "max": int(n_items) - 1}
        return column.with_properties({**column.properties, "domain": domain})

    return Schema([widened(c) if c.name == ITEM_LIST_COLUMN else c for c in schema])


def padded_inputs(
    sessions: pd.DataFrame,
    *,
    max_sequence_length: int,
    columns: Sequence[str] = MODEL_INPUT_COLUMNS,
) -> dict[str, torch.Tensor]:
    """Model inputs from workflow output rows: each list's last clicks, right-padded with 0."""
    inputs = {}
    for name in columns:
        if name not in sessions.columns:
            raise ValueError(
                f"the sessions have no column {name!r}: expected {list(columns)}, got "
                f"{list(sessions.columns)}. Pass the output of features.transform()"
            )
        dense = np.full((len(sessions), max_sequence_length), PADDING_ID, dtype=np.int64)
        for row, values in enumerate(sessions[name]):
            values = np.asarray(values, dtype=np.int64)[-max_sequence_length:]
            dense[row, : len(values)] = values
        inputs[name] = torch.from_numpy(dense)
    return inputs


def train(
    model: tr.Model,
    processed_train: pd.DataFrame,
    *,
    epochs: int = 10,
    batch_size: int = 128,
    learning_rate: float = 5e-3,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Train with Adam on the workflow's output rows; returns the mean loss of each epoch.

    ``progress`` shows a bar on stderr when it is a terminal, else one line per epoch (see
    ``TrainingProgress``).

    Sessions with a single click are skipped: masked language modeling keeps at least one item
    of a session visible, so such a session has nothing to predict. The same seed, data and
    model give the same weights (shuffling, masking and dropout all draw from that seed).
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(
            f"epochs and batch_size must be at least 1, got {epochs!r} and {batch_size!r}"
        )
    max_sequence_length = _max_sequence_length(model)
    trainable = processed_train[processed_train[ITEM_LIST_COLUMN].map(len) >= 2]
    if trainable.empty:
        raise ValueError(
            f"none of the {len(processed_train)} training sessions has two or more clicks, so "
            "there is nothing to learn; pass more (or longer) sessions"
        )
    inputs = padded_inputs(trainable, max_sequence_length=max_sequence_length)
    n_sessions = len(trainable)
    n_batches = -(-n_sessions // batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    shuffle = torch.Generator().manual_seed(seed)
    epoch_losses = []
    shown = TrainingProgress(epochs, n_batches, enabled=progress)
    with torch.random.fork_rng(), shown:
        torch.manual_seed(seed)
        model.train()
        for epoch in range(epochs):
            order = torch.randperm(n_sessions, generator=shuffle)
            batch_losses = []
            for start in range(0, n_sessions, batch_size):
                rows = order[start : start + batch_size]
                output = model(
                    {name: values[rows] for name, values in inputs.items()}, training=True
                )
                optimizer.zero_grad()
                output["loss"].backward()
                optimizer.step()
                batch_losses.append(output["loss"].item())
                shown.batch_done(epoch, batch_losses[-1])
            epoch_losses.append(float(np.mean(batch_losses)))
            shown.epoch_done(epoch, epoch_losses[-1])
    model.eval()
    return epoch_losses


class TrainingProgress:
    """Progress of ``train`` on ``stream`` (stderr): a bar that redraws itself on a terminal;
    elsewhere (a log file, CI, a notebook) one line per epoch, since there each redraw of a bar
    is kept as one more carriage-return-separated update."""

    def __init__(
        self,
        epochs: int,
        batches_per_epoch: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
    ):
        self.epochs, self.batches_per_epoch = epochs, batches_per_epoch
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.bar = (
            tqdm(total=epochs * batches_per_epoch, desc="training", unit="batch", file=self.stream)
            if enabled and _is_terminal(self.stream)
            else None
        )
        self._epoch_started = time.perf_counter()

    def batch_done(self, epoch: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update()
            self.bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.3f}")

    def epoch_done(self, epoch: int, mean_loss: float) -> None:
        if self.enabled and self.bar is None:
            seconds = time.perf_counter() - self._epoch_started
            print(
                f"training: epoch {epoch + 1}/{self.epochs}, {self.batches_per_epoch} batches in"
                f" {seconds:.1f} s, mean loss {mean_loss:.3f}",
                file=self.stream,
                flush=True,
            )
        self._epoch_started = time.perf_counter()

    def __enter__(self) -> TrainingProgress:
        return self

    def __exit__(self, *exc_info) -> None:
        if self.bar is not None:
            self.bar.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def next_item_examples(
    processed_sessions: pd.DataFrame, *, max_sequence_length: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each session of two or more clicks as (its clicks but the last, padded; its last item)."""
    evaluable = processed_sessions[processed_sessions[ITEM_LIST_COLUMN].map(len) >= 2]
    targets = torch.tensor([items[-1] for items in evaluable[ITEM_LIST_COLUMN]], dtype=torch.int64)
    prefixes = evaluable.assign(
        **{
            name: evaluable[name].map(lambda values: list(values)[:-1])
            for name in MODEL_INPUT_COLUMNS
        }
    )
    return padded_inputs(prefixes, max_sequence_length=max_sequence_length), targets


def recall_at_k(scores: torch.Tensor, targets: torch.Tensor, *, k: int = 10) -> float:
    """Share of rows whose target item is among the ``k`` best-scored items.

    Reserved ids (padding, null, out of vocabulary) are never recommended, so a target that is
    out of vocabulary always counts as a miss.
    """
    if scores.ndim != 2 or len(scores) != len(targets):
        raise ValueError(
            f"scores must be [rows, items] with one row per target, got shape {tuple(scores.shape)}"
            f" for {len(targets)} targets"
        )
    if len(targets) == 0:
        raise ValueError("there are no targets to compute recall on")
    scores = scores.clone()
    scores[:, :FIRST_ITEM_ID] = -torch.inf
    top_k = scores.topk(min(k, scores.shape[1]), dim=1).indices
    return float((top_k == targets[:, None]).any(dim=1).float().mean())


def evaluate_recall(
    model: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    processed_held_out: pd.DataFrame,
    *,
    k: int = 10,
    max_sequence_length: int | None = None,
    batch_size: int = 256,
) -> float:
    """Recall@k of predicting each held-out session's last item from the clicks before it.

    ``model`` is anything that maps padded inputs to scores ``[batch, items]``: the eager
    model, a traced one, or a baseline.
    """
    if max_sequence_length is None:
        max_sequence_length = _max_sequence_length(model)
    inputs, targets = next_item_examples(
        processed_held_out, max_sequence_length=max_sequence_length
    )
    if len(targets) == 0:
        raise ValueError(
            "no held-out session has two or more clicks, so there is nothing to predict"
        )
    if isinstance(model, torch.nn.Module):
        model.eval()
    with torch.no_grad():
        scores = torch.cat(
            [
                model({name: values[start : start + batch_size] for name, values in inputs.items()})
                for start in range(0, len(targets), batch_size)
            ]
        )
    return recall_at_k(scores, targets, k=k)


def popularity_recall(
    processed_train: pd.DataFrame, processed_held_out: pd.DataFrame, *, k: int = 10
) -> float:
    """Recall@k of always recommending the k items clicked most often in training: the baseline."""
    clicked = [np.asarray(items, dtype=np.int64) for items in processed_train[ITEM_LIST_COLUMN]]
    counts = np.bincount(np.concatenate(clicked))
    counts[:FIRST_ITEM_ID] = -1
    # A stable sort breaks ties towards the lower id, so the baseline is fully determined.
    most_clicked = np.argsort(-counts, kind="stable")[:k]
    targets = [items[-1] for items in processed_held_out[ITEM_LIST_COLUMN] if len(items) >= 2]
    if not targets:
        raise ValueError(
            "no held-out session has two or more clicks, so there is nothing to predict"
        )
    return float(np.isin(targets, most_clicked).mean())


def save_model(model: tr.Model, directory: str | Path) -> Path:
    """Pickle the whole model (Transformers4Rec's ``Model.save``, cloudpickle)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save(directory, model_name=_MODEL_FILE_STEM)
    return directory


def load_model(directory: str | Path) -> tr.Model:
    """The model saved by ``save_model``, in eval mode."""
    path = Path(directory) / f"{_MODEL_FILE_STEM}.pkl"
    if not path.exists():
        raise FileNotFoundError(
            f"{str(path)!r} does not exist; save a model there with save_model()"
        )
    model = tr.Model.load(directory, model_name=_MODEL_FILE_STEM)
    model.eval()
    return model


def _max_sequence_length(model) -> int:
    length = getattr(model, "max_sequence_length", None)
    if not length:
        raise ValueError(
            f"cannot tell the maximum sequence length of {type(model).__name__!r}; "
            "pass max_sequence_length=..."
        )
    return int(length)
