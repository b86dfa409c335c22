"""Splitting a Transformers4Rec next-item model into its session encoder and its item table: the
encoder's vector times the table (divided by the temperature) is the model's output, bit for bit."""

import pytest
import torch

from examples.session_based import features, model
from merlin_torch_serving import ModelPreparationError
from merlin_torch_serving.model_prep.next_item import next_item_scoring, session_encoder
from tests import session_models
from tests.session_models import MAX_SEQUENCE_LENGTH


@pytest.fixture(scope="module")
def inputs(session_workflow, session_split):
    _, held_out = session_split
    sessions = features.transform(session_workflow, held_out).head(16)
    return model.padded_inputs(sessions, max_sequence_length=MAX_SEQUENCE_LENGTH)


def assert_split_scores_like_the_model(t4r_model, inputs):
    with torch.no_grad(), session_models.torch_threads(1):
        want = t4r_model(dict(inputs))
        vectors = session_encoder(t4r_model)(dict(inputs))
        scoring = next_item_scoring(t4r_model)
        scores = vectors @ scoring.item_vectors.t()
        if scoring.temperature:
            scores = torch.div(scores, scoring.temperature)
    assert vectors.shape == (len(want), scoring.item_vectors.shape[1])
    assert torch.equal(scores, want)


def test_tied_xlnet_scores_as_its_session_vector_times_its_item_embeddings(xlnet, inputs):
    assert_split_scores_like_the_model(xlnet.eager, inputs)
    table = (
        xlnet.eager.heads[0]
        .prediction_task_dict["next-item"]
        .pre.module.item_embedding_table.weight
    )
    assert (
        next_item_scoring(xlnet.eager).item_vectors.data_ptr() == table.data_ptr()
    )  # shared, not copied


def test_untied_model_with_a_temperature_scores_with_its_output_layer(session_workflow, inputs):
    untied = session_models.gpt2(
        session_workflow, seed=3, weight_tying=False, softmax_temperature=0.25
    ).eager

    assert_split_scores_like_the_model(untied, inputs)
    assert next_item_scoring(untied).temperature == 0.25


def test_splitting_leaves_the_users_model_as_it_was(gpt2, inputs):
    with torch.no_grad():
        before = gpt2.eager(dict(inputs))
        session_encoder(gpt2.eager)
        after = gpt2.eager(dict(inputs))
    assert torch.equal(before, after)
    assert all(
        a is b
        for a, b in zip(
            session_encoder(gpt2.eager).parameters(), gpt2.eager.parameters(), strict=True
        )
    )


def test_a_model_that_is_not_transformers4rec_cannot_be_split():
    with pytest.raises(
        ModelPreparationError,
        match=r"model 'Linear': is not a Transformers4Rec Model.*RetrieveTopK\(item_vectors=...\)",
    ):
        session_encoder(torch.nn.Linear(3, 2))


def test_a_negative_temperature_is_refused(session_workflow):
    reversed_model = session_models.gpt2(
        session_workflow, weight_tying=False, softmax_temperature=-1.0
    ).eager
    with pytest.raises(
        ModelPreparationError,
        match=r"negative softmax_temperature \(-1.0\), which reverses the ranking",
    ):
        next_item_scoring(reversed_model)
