"""The session-based example's library: synthetic data, files, the workflow and the model, at sizes
small enough to run in seconds (the full-size demo is not a unit test)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch
from merlin.schema import Tags

from examples.session_based import data, features, model

MAX_SEQUENCE_LENGTH = 8


@pytest.fixture(scope="module")
def interactions():
    return data.generate_interactions(n_sessions=300, n_items=200, n_categories=10, seed=1)


@pytest.fixture(scope="module")
def full_size_interactions():
    # Generating the demo's default size takes well under a second; distributions need it.
    return data.generate_interactions()


@pytest.fixture(scope="module")
def split(interactions):
    return data.split_by_time(interactions, held_out_fraction=0.2)


@pytest.fixture(scope="module")
def workflow_directory(tmp_path_factory):
    return tmp_path_factory.mktemp("workflow")


@pytest.fixture(scope="module")
def workflow(split, workflow_directory):
    train, _ = split
    return features.fit_workflow(train, workflow_directory, max_sequence_length=MAX_SEQUENCE_LENGTH)


@pytest.fixture(scope="module")
def processed(workflow, split):
    train, held_out = split
    return features.transform(workflow, train), features.transform(workflow, held_out)


@pytest.fixture(scope="module")
def trained_model(workflow, processed):
    processed_train, _ = processed
    session_model = model.build_model(
        workflow.output_schema, max_sequence_length=MAX_SEQUENCE_LENGTH, d_model=32
    )
    model.train(session_model, processed_train, epochs=1, progress=False)
    return session_model


def sessions_frame(item_lists):
    """Workflow-shaped rows whose category list mirrors the item list (enough for the model)."""
    return pd.DataFrame(
        {
            features.ITEM_LIST_COLUMN: item_lists,
            features.CATEGORY_LIST_COLUMN: [list(items) for items in item_lists],
        }
    )


# --- synthetic interactions -------------------------------------------------------------------


def test_generated_interactions_have_the_four_columns_as_int64(interactions):
    assert list(interactions.columns) == list(data.INTERACTION_COLUMNS)
    assert all(dtype == np.int64 for dtype in interactions.dtypes)


def test_generated_interactions_are_the_same_for_the_same_seed(interactions):
    again = data.generate_interactions(n_sessions=300, n_items=200, n_categories=10, seed=1)
    other = data.generate_interactions(n_sessions=300, n_items=200, n_categories=10, seed=2)
    pd.testing.assert_frame_equal(interactions, again)
    assert not interactions.equals(other)


def test_session_lengths_run_from_one_to_the_maximum_with_a_long_tail(full_size_interactions):
    lengths = full_size_interactions.groupby("session_id").size()
    assert lengths.min() == 1
    assert lengths.max() == data.MAX_SESSION_LENGTH
    # A long tail: the mean sits well above the median, and most sessions are short.
    assert lengths.mean() > lengths.median() + 1
    assert (lengths <= 10).mean() > 0.8


def test_item_popularity_is_skewed_when_generated(full_size_interactions):
    clicks_per_item = full_size_interactions["item_id"].value_counts()
    top_tenth = clicks_per_item.iloc[: len(clicks_per_item) // 10].sum()
    # With uniform popularity the top tenth of items would get about a tenth of the clicks.
    assert top_tenth / len(full_size_interactions) > 0.3


def test_each_item_has_one_category_and_raw_ids_are_not_a_dense_range(full_size_interactions):
    assert full_size_interactions.groupby("item_id")["category"].nunique().max() == 1
    item_ids = full_size_interactions["item_id"]
    assert item_ids.min() > item_ids.nunique()


def test_clicks_within_a_session_have_increasing_timestamps(interactions):
    steps = interactions.groupby("session_id")["timestamp"].diff().dropna()
    assert (steps > 0).all()


def test_previous_item_predicts_the_next_better_than_popularity(full_size_interactions):
    """The learnable signal: a count-based 'what follows this item' beats 'what is popular'."""
    train, held_out = data.split_by_time(full_size_interactions)
    ordered = train.sort_values(["session_id", "timestamp"])
    pairs = pd.DataFrame(
        {"previous": ordered.groupby("session_id")["item_id"].shift(), "next": ordered["item_id"]}
    ).dropna()
    followers = (
        pairs.groupby(["previous", "next"]).size().sort_values(ascending=False, kind="stable")
    )
    top_followers = (
        followers.reset_index().groupby("previous")["next"].apply(lambda s: set(s.iloc[:10]))
    )
    popular = set(train["item_id"].value_counts().index[:10])

    sessions = held_out.sort_values("timestamp").groupby("session_id")["item_id"].apply(list)
    sessions = sessions[sessions.map(len) >= 2]
    popularity_hits = np.mean([items[-1] in popular for items in sessions])
    follower_hits = np.mean(
        [items[-1] in top_followers.get(items[-2], set()) for items in sessions]
    )
    assert follower_hits > popularity_hits + 0.15


# --- files and validation ---------------------------------------------------------------------


@pytest.mark.parametrize("file_name", ["clicks.parquet", "clicks.csv"])
def test_interactions_round_trip_through_a_file(interactions, tmp_path, file_name):
    path = data.write_interactions(interactions, tmp_path / file_name)
    pd.testing.assert_frame_equal(data.read_interactions(path), interactions)


def test_reading_a_file_without_a_column_names_the_missing_column(interactions, tmp_path):
    path = tmp_path / "clicks.csv"
    interactions.drop(columns=["category"]).to_csv(path, index=False)
    with pytest.raises(
        ValueError,
        match=r"^name the columns of .* or map yours with --columns YOURS=category "
        r"\(columns=\{'yours': 'category', ...\}\): it has no column 'category'",
    ):
        data.read_interactions(path)


def test_reading_a_file_with_other_column_names_and_a_mapping(interactions, tmp_path):
    path = tmp_path / "clicks.csv"
    renamed = {"session_id": "user_session", "item_id": "product_id", "timestamp": "ts"}
    interactions.rename(columns=renamed).to_csv(path, index=False)
    with pytest.raises(
        ValueError, match=r"it has no column 'session_id', 'item_id', 'timestamp'; its columns"
    ):
        data.read_interactions(path)
    mapped = data.read_interactions(
        path, columns={theirs: ours for ours, theirs in renamed.items()}
    )
    pd.testing.assert_frame_equal(mapped[list(data.INTERACTION_COLUMNS)], interactions)


def test_whole_float_ids_are_read_as_integers(interactions):
    validated = data.validate_interactions(
        interactions.astype({"item_id": "float64", "session_id": "float64"})
    )
    pd.testing.assert_frame_equal(validated, interactions)


def test_reading_a_file_with_an_unknown_suffix_asks_for_parquet_or_csv(tmp_path):
    path = tmp_path / "clicks.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"ending in \.parquet or \.csv"):
        data.read_interactions(path)


def test_reading_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape("nowhere.parquet")):
        data.read_interactions(tmp_path / "nowhere.parquet")


def test_validation_rejects_item_ids_that_are_not_integers():
    clicks = pd.DataFrame(
        {"session_id": [1], "item_id": ["shoe"], "category": [7], "timestamp": [10]}
    )
    with pytest.raises(ValueError, match=r"column 'item_id' must hold integers, got dtype object"):
        data.validate_interactions(clicks)


def test_validation_turns_datetime_timestamps_into_seconds_and_ints_into_int64():
    clicks = pd.DataFrame(
        {
            "session_id": np.array([1, 1], dtype=np.int32),
            "item_id": [5, 6],
            "category": [7, 7],
            "timestamp": pd.to_datetime(["1970-01-01 00:00:10", "1970-01-02 00:00:00"]),
        }
    )
    validated = data.validate_interactions(clicks)
    assert validated["timestamp"].tolist() == [10, 86_400]
    assert all(validated[column].dtype == np.int64 for column in data.INTERACTION_COLUMNS)


# --- split ------------------------------------------------------------------------------------


def test_split_by_time_holds_out_the_latest_whole_sessions(interactions, split):
    train, held_out = split
    assert set(train["session_id"]).isdisjoint(held_out["session_id"])
    assert len(train) + len(held_out) == len(interactions)
    assert held_out["session_id"].nunique() == round(0.2 * interactions["session_id"].nunique())
    train_starts = train.groupby("session_id")["timestamp"].min()
    held_out_starts = held_out.groupby("session_id")["timestamp"].min()
    assert held_out_starts.min() >= train_starts.max()


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5])
def test_split_by_time_rejects_a_fraction_outside_zero_and_one(interactions, fraction):
    with pytest.raises(ValueError, match="held_out_fraction must be between 0 and 1"):
        data.split_by_time(interactions, held_out_fraction=fraction)


# --- workflow ---------------------------------------------------------------------------------


def test_workflow_output_schema_has_ragged_int64_lists_with_the_model_tags(workflow):
    schema = workflow.output_schema
    assert set(schema.column_names) == {
        features.ITEM_LIST_COLUMN,
        features.CATEGORY_LIST_COLUMN,
        "session_id",
        features.SESSION_LENGTH_COLUMN,
        features.SESSION_START_COLUMN,
    }
    items, categories = schema[features.ITEM_LIST_COLUMN], schema[features.CATEGORY_LIST_COLUMN]
    assert {Tags.ITEM, Tags.ID, Tags.CATEGORICAL, Tags.LIST} <= set(items.tags)
    assert {Tags.CATEGORICAL, Tags.LIST} <= set(categories.tags)
    assert Tags.ITEM not in categories.tags
    for column in (items, categories):
        assert column.dtype.name == "int64"
        assert column.is_list
        assert column.is_ragged
        assert column.properties["value_count"]["max"] == MAX_SEQUENCE_LENGTH


def test_workflow_keeps_each_sessions_last_clicks_in_time_order(workflow, split, processed):
    train, _ = split
    processed_train, _ = processed
    raw_item_of = features.item_id_lookup(workflow)
    expected = (
        train.sort_values("timestamp")
        .groupby("session_id")["item_id"]
        .apply(lambda items: items.tolist()[-MAX_SEQUENCE_LENGTH:])
    )
    decoded = {
        session: raw_item_of[np.asarray(items)].tolist()
        for session, items in zip(
            processed_train["session_id"], processed_train[features.ITEM_LIST_COLUMN], strict=True
        )
    }
    assert decoded == expected.to_dict()


def test_workflow_lists_are_ragged_int_lists_no_longer_than_the_maximum(processed):
    processed_train, _ = processed
    for column in (features.ITEM_LIST_COLUMN, features.CATEGORY_LIST_COLUMN):
        lengths = processed_train[column].map(len)
        assert lengths.max() == MAX_SEQUENCE_LENGTH
        assert lengths.min() == 1  # no padding added
        assert all(np.asarray(values).dtype == np.int64 for values in processed_train[column])
    assert (
        processed_train[features.ITEM_LIST_COLUMN].map(len)
        <= processed_train[features.SESSION_LENGTH_COLUMN]
    ).all()


def test_workflow_encodes_unseen_items_as_out_of_vocabulary(workflow, split):
    train, _ = split
    known = train.iloc[0]
    clicks = pd.DataFrame(
        {
            "session_id": [1, 1],
            "item_id": [known["item_id"], 123],  # 123 is below every generated raw id
            "category": [known["category"], known["category"]],
            "timestamp": [10, 20],
        }
    )
    encoded = features.transform(workflow, clicks)[features.ITEM_LIST_COLUMN].iloc[0]
    assert encoded[0] >= features.FIRST_ITEM_ID
    assert encoded[1] == features.OUT_OF_VOCABULARY_ID


def test_loaded_workflow_transforms_like_the_fitted_one(workflow_directory, split, processed):
    _, held_out = split
    _, processed_held_out = processed
    loaded = features.load_workflow(workflow_directory)
    pd.testing.assert_frame_equal(features.transform(loaded, held_out), processed_held_out)


def test_loading_a_workflow_from_an_empty_folder_says_how_to_create_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no saved workflow .*fit_workflow\(\)"):
        features.load_workflow(tmp_path)


# --- model ------------------------------------------------------------------------------------


class NextIdScorer(torch.nn.Module):
    """A hand-made 'model' that always puts the highest score on (last clicked id + 1)."""

    n_items = 12

    def forward(self, inputs):
        items = inputs[features.ITEM_LIST_COLUMN]
        last = items.gather(1, ((items != 0).sum(1, keepdim=True) - 1).clamp(min=0)).squeeze(1)
        return torch.nn.functional.one_hot((last + 1) % self.n_items, self.n_items).float()


def test_padded_inputs_keep_the_last_clicks_and_pad_on_the_right_with_zero():
    inputs = model.padded_inputs(sessions_frame([[3, 4], [5, 6, 7, 8, 9]]), max_sequence_length=4)
    assert set(inputs) == set(model.MODEL_INPUT_COLUMNS)
    assert inputs[features.ITEM_LIST_COLUMN].tolist() == [[3, 4, 0, 0], [6, 7, 8, 9]]
    assert inputs[features.ITEM_LIST_COLUMN].dtype == torch.int64


def test_padded_inputs_name_a_missing_column():
    with pytest.raises(ValueError, match=r"no column 'category-list'"):
        model.padded_inputs(pd.DataFrame({features.ITEM_LIST_COLUMN: [[3]]}), max_sequence_length=4)


def test_recall_at_k_counts_rows_whose_target_is_in_the_top_k():
    scores = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.9, 0.5, 0.1],  # ranking 3, 4, 5
            [0.0, 0.0, 0.0, 0.1, 0.5, 0.9],  # ranking 5, 4, 3
            [0.0, 0.0, 0.0, 0.5, 0.9, 0.1],  # ranking 4, 3, 5
        ]
    )
    targets = torch.tensor([3, 3, 5])
    assert model.recall_at_k(scores, targets, k=1) == pytest.approx(1 / 3)  # only row 0
    assert model.recall_at_k(scores, targets, k=2) == pytest.approx(1 / 3)  # row 1 ranks 3 last
    assert model.recall_at_k(scores, targets, k=3) == pytest.approx(1.0)


def test_recall_at_k_never_counts_reserved_ids_as_recommendations():
    # Id 2 (out of vocabulary) scores highest but is never recommended, so it is never a hit.
    scores = torch.tensor([[0.0, 0.0, 9.0, 1.0, 0.5], [0.0, 0.0, 9.0, 1.0, 0.5]])
    targets = torch.tensor([features.OUT_OF_VOCABULARY_ID, 3])
    assert model.recall_at_k(scores, targets, k=1) == pytest.approx(0.5)


def test_evaluate_recall_predicts_each_sessions_last_item_from_the_clicks_before_it():
    held_out = sessions_frame([[3, 4, 5], [6, 7], [8, 3], [9]])
    # Prefixes [3, 4], [6], [8] -> predictions 5 (hit), 7 (hit), 9 (miss for 3); [9] is too short.
    recall = model.evaluate_recall(NextIdScorer(), held_out, k=1, max_sequence_length=4)
    assert recall == pytest.approx(2 / 3)


def test_evaluate_recall_needs_a_session_with_two_clicks():
    with pytest.raises(ValueError, match="no held-out session has two or more clicks"):
        model.evaluate_recall(NextIdScorer(), sessions_frame([[3], [4]]), max_sequence_length=4)


def test_popularity_recall_recommends_the_most_clicked_training_items():
    train = sessions_frame([[3, 3, 4], [3, 5]])  # clicks: 3 three times, 4 and 5 once each
    held_out = sessions_frame([[4, 3], [5, 4], [7]])  # targets 3 and 4; [7] is too short
    assert model.popularity_recall(train, held_out, k=1) == pytest.approx(0.5)
    # 4 and 5 tie for second place; the lower id wins, so both targets are hits.
    assert model.popularity_recall(train, held_out, k=2) == pytest.approx(1.0)


def test_build_model_names_a_column_missing_from_the_schema(workflow):
    schema = workflow.output_schema.remove_by_tag(Tags.ITEM)
    with pytest.raises(ValueError, match=r"the schema has no column 'item_id-list'"):
        model.build_model(schema)


def test_train_rejects_sessions_that_all_have_a_single_click(workflow):
    session_model = model.build_model(workflow.output_schema, max_sequence_length=4, d_model=16)
    with pytest.raises(ValueError, match="none of the 2 training sessions has two or more clicks"):
        model.train(session_model, sessions_frame([[3], [4]]), progress=False)


def test_training_twice_with_the_same_seed_gives_the_same_weights(workflow, processed):
    processed_train, _ = processed
    weights = []
    for _ in range(2):
        session_model = model.build_model(
            workflow.output_schema, max_sequence_length=MAX_SEQUENCE_LENGTH, d_model=16
        )
        losses = model.train(session_model, processed_train, epochs=2, progress=False)
        assert len(losses) == 2
        assert all(np.isfinite(losses))
        weights.append(session_model.state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_training_off_a_terminal_prints_one_line_per_epoch_and_no_carriage_return(
    workflow, processed, capsys
):
    processed_train, _ = processed
    session_model = model.build_model(
        workflow.output_schema, max_sequence_length=MAX_SEQUENCE_LENGTH, d_model=16
    )
    losses = model.train(session_model, processed_train, epochs=2, batch_size=64)

    captured = capsys.readouterr()  # stderr as a log file or CI sees it: not a terminal
    assert captured.out == ""
    assert "\r" not in captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 2, captured.err
    for epoch, (line, loss) in enumerate(zip(lines, losses, strict=True), start=1):
        assert re.fullmatch(
            rf"training: epoch {epoch}/2, \d+ batches in \d+\.\d s, mean loss {loss:.3f}", line
        ), line


def test_training_progress_on_a_terminal_is_a_bar_redrawn_in_place():
    import os
    import select

    controller, terminal = os.openpty()
    try:
        with open(terminal, "w", closefd=False) as stream:
            assert stream.isatty()
            with model.TrainingProgress(2, 3, stream=stream) as progress:
                for epoch in range(2):
                    for _ in range(3):
                        progress.batch_done(epoch, 1.5)
                    progress.epoch_done(epoch, 1.5)
        shown = b""
        while select.select([controller], [], [], 1.0)[0]:
            chunk = os.read(controller, 65536)
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(controller)
        os.close(terminal)
    text = shown.decode()
    assert "\r" in text
    assert "training: 100%" in text, text
    assert "6/6" in text, text
    assert "epoch 2/2" not in text  # the bar, not the lines written off a terminal


def test_trained_model_scores_every_encoded_item_for_each_session(
    workflow, processed, trained_model
):
    _, processed_held_out = processed
    inputs = model.padded_inputs(processed_held_out, max_sequence_length=MAX_SEQUENCE_LENGTH)
    with torch.no_grad():
        scores = trained_model(inputs)
    n_encoded_items = (
        workflow.output_schema[features.ITEM_LIST_COLUMN].properties["domain"]["max"] + 1
    )
    assert scores.shape == (len(processed_held_out), n_encoded_items)
    assert scores.dtype == torch.float32
    assert 0.0 <= model.evaluate_recall(trained_model, processed_held_out) <= 1.0


def test_saved_model_loads_in_eval_mode_and_scores_the_same(processed, trained_model, tmp_path):
    _, processed_held_out = processed
    inputs = model.padded_inputs(processed_held_out, max_sequence_length=MAX_SEQUENCE_LENGTH)
    loaded = model.load_model(model.save_model(trained_model, tmp_path / "model"))
    assert not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded(dict(inputs)), trained_model(dict(inputs)))


def test_loading_a_model_from_an_empty_folder_says_how_to_save_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"save_model\(\)"):
        model.load_model(tmp_path)


def test_traced_model_scores_like_the_eager_one_for_any_batch_size(processed, trained_model):
    """What serving relies on: one trace with dense padded inputs serves every batch size."""
    _, processed_held_out = processed
    inputs = model.padded_inputs(processed_held_out, max_sequence_length=MAX_SEQUENCE_LENGTH)
    traced = torch.jit.trace(trained_model, ({k: v[:16] for k, v in inputs.items()},), strict=True)
    short_row = {name: values[:1].clone() for name, values in inputs.items()}
    for values in short_row.values():
        values[0, 1:] = features.PADDING_ID  # a session with a single click
    batches = [{k: v[:size] for k, v in inputs.items()} for size in (1, 7, len(processed_held_out))]
    with torch.no_grad():
        for batch in batches + [short_row]:
            assert torch.equal(traced(dict(batch)), trained_model(dict(batch)))
