"""The session-based example's clicks and workflow with three next-item models, and the reference
they are checked against, for the serving tests (built once per test session by the fixtures in
tests/conftest.py):

- a Transformers4Rec XLNet (masked language modeling), trained briefly;
- a Transformers4Rec GPT2 (causal language modeling), untrained, its weights fixed by a seed;
- a plain TorchScript model (tests/toy_session.py's ``PositionalSessionModel``), seeded.

The reference is the eager model on NVTabular's own transform, computed independently of the
library: pad each session's last clicks, score the whole catalog, leave out the session's items
and the reserved ids, take the top k, map encoded ids back to raw ids when the graph decodes them.
Served ids must equal it; scores agree within SCORE_TOLERANCE (the eager model scores another
batch, and float32 matmuls round differently with the batch's shape: ~1e-6 measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from examples.session_based import data, features, model
from merlin_torch_serving import ModelOptions

# served models run with ModelOptions' thread count; an in-process reference computed with the
# same count (torch_threads) sums floats in the same order, so the two compare bit for bit
from merlin_torch_serving.graph.threads import torch_threads  # noqa: F401
from tests import toy_session

MAX_SEQUENCE_LENGTH = 20
SCORE_TOLERANCE = 1e-4
UNSEEN_ITEM_ID = 900_000_000  # raw ids from here on never occur in training
RESERVED_IDS = (0, 1, 2)
#: the torch threads served models run with unless exported otherwise
SERVED_TORCH_THREADS = ModelOptions().torch_threads


@dataclass(frozen=True)
class SessionModel:
    """A model to serve and its eager twin.

    The model to serve is eager Transformers4Rec, or TorchScript with its schemas.
    """

    name: str
    served: object
    eager: torch.nn.Module
    #: PredictPytorch's extra arguments (schemas for a plain TorchScript model)
    predict_kwargs: dict


def clicks() -> pd.DataFrame:
    return data.generate_interactions(n_sessions=1500, n_items=400, n_categories=20, seed=11)


def xlnet(workflow, train: pd.DataFrame) -> SessionModel:
    xlnet_model = model.build_model(
        workflow.output_schema, max_sequence_length=MAX_SEQUENCE_LENGTH, d_model=32
    )
    model.train(xlnet_model, features.transform(workflow, train), epochs=2, progress=False)
    xlnet_model.eval()
    return SessionModel("xlnet", xlnet_model, xlnet_model, {})


def gpt2(workflow, seed: int = 0, **task_options) -> SessionModel:
    """A GPT2 next-item model as Transformers4Rec builds one (causal masking, tied embeddings
    unless ``task_options`` of ``NextItemPredictionTask`` say otherwise)."""
    import transformers4rec.torch as tr

    schema = workflow.output_schema.select_by_name(list(model.MODEL_INPUT_COLUMNS))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        inputs = tr.TabularSequenceFeatures.from_schema(
            schema,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            aggregation="concat",
            d_output=32,
            masking="clm",
        )
        config = tr.GPT2Config.build(
            d_model=32, n_head=2, n_layer=2, total_seq_length=MAX_SEQUENCE_LENGTH
        )
        body = tr.SequentialBlock(
            inputs, tr.MLPBlock([32]), tr.TransformerBlock(config, masking=inputs.masking)
        )
        config = tr.GPT2Config.build(
            d_model=32, n_head=2, n_layer=2, total_seq_length=MAX_SEQUENCE_LENGTH
        )
        body = tr.SequentialBlock(
            inputs, tr.MLPBlock([32]), tr.TransformerBlock(config, masking=inputs.masking)
        )
        task = tr.NextItemPredictionTask(**{"weight_tying": True, **task_options})
        head = tr.Head(body, task, inputs=inputs)
        gpt2_model = tr.Model(head, max_sequence_length=MAX_SEQUENCE_LENGTH).eval()
    return SessionModel("gpt2", gpt2_model, gpt2_model, {})


def torchscript(workflow) -> SessionModel:
    scripted, input_schema, output_schema = toy_session.scripted_model(
        workflow, MAX_SEQUENCE_LENGTH
    )
    output = workflow.output_schema
    eager = toy_session.PositionalSessionModel(
        int(output["item_id-list"].properties["domain"]["max"]) + 1,
        int(output["category-list"].properties["domain"]["max"]) + 1,
        MAX_SEQUENCE_LENGTH,
    ).eval()
    return SessionModel(
        "torchscript",
        scripted,
        eager,
        {"input_schema": input_schema, "output_schema": output_schema},
    )


def request_rows(held_out: pd.DataFrame, n_sessions: int, seed: int) -> pd.DataFrame:
    """Raw clicks of ``n_sessions`` held-out sessions, shuffled: the longest session (longer than
    the model's maximum length) and a single-click one always among them, and about one click in
    five replaced by an item never seen in training."""
    rng = np.random.default_rng(seed)
    lengths = held_out.groupby("session_id").size()
    longest, single = lengths.idxmax(), lengths[lengths == 1].index[0]
    if lengths[longest] <= MAX_SEQUENCE_LENGTH:
        raise ValueError(
            f"no held-out session is longer than {MAX_SEQUENCE_LENGTH} clicks; generate longer ones"
        )
    others = lengths.index.difference([longest, single]).to_numpy()
    chosen = [longest, single][:n_sessions] + list(
        rng.choice(others, max(n_sessions - 2, 0), replace=False)
    )
    rows = held_out[held_out["session_id"].isin(chosen)].copy()
    unseen = rng.random(len(rows)) < 0.2
    rows.loc[unseen, "item_id"] = UNSEEN_ITEM_ID + np.arange(unseen.sum())
    return rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def eager_top_k(
    workflow, eager: torch.nn.Module, rows: pd.DataFrame, k: int, decoded: bool
) -> pd.DataFrame:
    """Per session (indexed by id): top-k ids (raw when ``decoded``), their scores, all scores."""
    sessions = features.transform(workflow, rows)
    inputs = model.padded_inputs(sessions, max_sequence_length=MAX_SEQUENCE_LENGTH)
    with torch.no_grad():
        scores = eager(inputs).numpy()
    encoded = masked_top_k(scores, sessions["item_id-list"], k)
    return pd.DataFrame(
        {
            "item_ids": list(features.item_id_lookup(workflow)[encoded] if decoded else encoded),
            "item_scores": list(np.take_along_axis(scores, encoded, axis=1)),
            "all_scores": list(scores),
        },
        index=sessions["session_id"].to_numpy(),
    )


def masked_top_k(scores: np.ndarray, seen_lists, k: int) -> np.ndarray:
    """The k best encoded ids per row; ties go to the lower id.

    The reserved ids and each row's seen items are left out.
    """
    masked = scores.copy()
    masked[:, list(RESERVED_IDS)] = -np.inf
    for row, seen in enumerate(seen_lists):
        masked[row, np.asarray(seen, dtype=np.int64)] = -np.inf
    return np.argsort(-masked, axis=1, kind="stable")[:, :k]


def assert_same_recommendations(
    answer: pd.DataFrame,
    expected: pd.DataFrame,
    workflow,
    decoded: bool,
    tolerance: float = SCORE_TOLERANCE,
) -> None:
    """Same ids in the same order, except where two eager scores are closer than the tolerance
    (a near tie may swap); scores within the tolerance."""
    lookup = features.item_id_lookup(workflow)
    encode = (
        {int(raw): encoded for encoded, raw in enumerate(lookup) if raw >= 0} if decoded else None
    )
    for session_id, ids, scores in zip(
        answer["session_id"], answer["item_ids"], answer["item_scores"], strict=True
    ):
        want = expected.loc[session_id]
        np.testing.assert_allclose(
            scores,
            want["item_scores"],
            rtol=0,
            atol=tolerance,
            err_msg=f"session {session_id}",
        )
        for position, (got, wanted) in enumerate(zip(ids, want["item_ids"], strict=True)):
            if got != wanted:
                eager_score_of_got = want["all_scores"][encode[int(got)] if decoded else int(got)]
                assert abs(eager_score_of_got - want["item_scores"][position]) <= tolerance, (
                    f"session {session_id}, rank {position + 1}: served item {got}, eager item"
                    f" {wanted}"
                )
