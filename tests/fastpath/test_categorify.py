"""The compiled Categorify: labels by frequency, null and out-of-vocabulary labels, fallbacks."""

from __future__ import annotations

import numpy as np
import nvtabular as nvt
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_torch_serving import CategoryVocabulary
from merlin_torch_serving.fastpath import compile_workflow
from tests.fastpath.helpers import (
    OFFSETS,
    VALUES,
    assert_wire_equal,
    fit,
    oracle,
    run_module,
    scripted_module,
)

# "b" three times, "a" twice, "c" once: labels 3, 4, 5 in that order
LETTERS = pd.DataFrame({"item": ["b", "a", "b", "c", "a", "b"]})


@pytest.fixture
def out_path(tmp_path):
    return str(tmp_path)


def categorify(train: pd.DataFrame, out_path: str, **options) -> nvt.Workflow:
    return fit(list(train.columns) >> nvt.ops.Categorify(out_path=out_path, **options), train)


def test_categorify_labels_vocabulary_by_frequency_after_the_reserved_labels(out_path):
    workflow = categorify(LETTERS, out_path)
    request = {"item": np.array(["a", "b", "c", "zzz", None], dtype=object)}
    got = compile_workflow(workflow).transform(request)
    # 0 padding, 1 null, 2 out of vocabulary, then most frequent first
    np.testing.assert_array_equal(got["item"], [4, 3, 5, 2, 1])
    assert got["item"].dtype == np.int64
    assert_wire_equal(got, oracle(workflow, request))


def test_categorify_maps_values_below_freq_threshold_to_the_oov_label(out_path):
    workflow = categorify(LETTERS, out_path, freq_threshold=2)
    request = {"item": np.array(["a", "b", "c"], dtype=object)}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["item"], [4, 3, 2])
    assert_wire_equal(got, oracle(workflow, request))


def test_categorify_max_size_keeps_only_the_most_frequent_values(out_path):
    # max_size 4 leaves one label after 0, 1 and 2
    workflow = categorify(LETTERS, out_path, max_size=4)
    request = {"item": np.array(["a", "b", "c"], dtype=object)}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["item"], [2, 3, 2])
    assert_wire_equal(got, oracle(workflow, request))


def test_categorify_output_dtype_follows_the_dtype_argument(out_path):
    workflow = categorify(LETTERS, out_path, dtype=np.int32)
    request = {"item": np.array(["a", "q"], dtype=object)}
    got = compile_workflow(workflow).transform(request)
    assert got["item"].dtype == np.int32
    assert_wire_equal(got, oracle(workflow, request))


@pytest.fixture(scope="module")
def letters_workflow(tmp_path_factory):
    return categorify(LETTERS, str(tmp_path_factory.mktemp("letters")))


@pytest.fixture(scope="module")
def float_workflow(tmp_path_factory):
    train = pd.DataFrame({"item": [1.0, 2.0, 2.0, np.nan, 3.5, 3.5, 3.5, 8.0, np.nan]})
    return categorify(train, str(tmp_path_factory.mktemp("floats")))


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.one_of(st.sampled_from(["a", "b", "c", "", "B"]), st.text(max_size=2), st.none()),
        min_size=1,
        max_size=40,
    )
)
def test_categorify_string_requests_equal_nvtabular(letters_workflow, items):
    if all(item is None for item in items):
        items[0] = "a"  # a column of nulls only fails in NVTabular (see below)
    request = {"item": np.array(items, dtype=object)}
    assert_wire_equal(
        compile_workflow(letters_workflow).transform(request), oracle(letters_workflow, request)
    )


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.one_of(st.integers(0, 8).map(float), st.floats(-3, 12), st.just(np.nan)),
        min_size=1,
        max_size=40,
    )
)
def test_categorify_float_ids_fitted_with_nulls_encode_nan_as_null_like_nvtabular(
    float_workflow, items
):
    if all(np.isnan(items)):
        items[0] = 1.0
    request = {"item": np.array(items, dtype=np.float64)}
    got = compile_workflow(float_workflow).transform(request)
    np.testing.assert_array_equal(got["item"][np.isnan(items)], 1)
    assert_wire_equal(got, oracle(float_workflow, request))
    assert_wire_equal(run_module(scripted_module(float_workflow), request), got)


@settings(max_examples=40, deadline=None)
@given(
    items=st.lists(
        st.one_of(st.integers(-3, 10), st.integers(10**6, 10**6 + 3)), min_size=1, max_size=40
    )
)
def test_scripted_categorify_of_integer_ids_equals_nvtabular(integer_workflow, items):
    request = {"item": np.array(items, dtype=np.int64)}
    assert_wire_equal(
        run_module(scripted_module(integer_workflow), request), oracle(integer_workflow, request)
    )


@pytest.fixture(scope="module")
def integer_workflow(tmp_path_factory):
    train = pd.DataFrame({"item": np.array([1, 2, 2, 3, 7, 7, 7, -2], dtype=np.int64)})
    return categorify(train, str(tmp_path_factory.mktemp("integers")))


def test_scripted_categorify_refuses_a_request_of_another_dtype_than_its_schema(
    integer_workflow,
):
    # Triton holds served requests to the schema; a module called directly says what is wrong
    with pytest.raises(torch.jit.Error, match="input column 'item': expected int64 values"):
        run_module(scripted_module(integer_workflow), {"item": np.array([2.5])})


def test_scripted_categorify_of_strings_says_they_stay_with_python(letters_workflow):
    from merlin_torch_serving.scripted_workflow import ScriptedWorkflow

    [(operator, reason)] = ScriptedWorkflow(letters_workflow).uncompiled
    assert operator == "Categorify"
    assert "strings" in reason


def test_categorify_truncates_floats_against_an_integer_vocabulary_like_nvtabular(out_path):
    workflow = categorify(pd.DataFrame({"item": [1, 2, 2, 3]}), out_path)
    request = {"item": np.array([2.7, 1.0, -0.5, 3.2])}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["item"], [3, 4, 2, 5])  # 2.7 -> 2, -0.5 -> 0 (unseen)
    assert_wire_equal(got, oracle(workflow, request))


def test_categorify_encodes_nan_as_null_where_nvtabular_fails_on_an_integer_vocabulary(out_path):
    workflow = categorify(pd.DataFrame({"item": [1, 2, 2, 3]}), out_path)
    request = {"item": np.array([2.0, np.nan, np.inf])}
    with pytest.raises(RuntimeError, match="Failed to categorical encode"):
        oracle(workflow, request)
    np.testing.assert_array_equal(compile_workflow(workflow).transform(request)["item"], [3, 1, 2])


def test_categorify_encodes_a_column_of_nulls_where_nvtabular_fails(out_path):
    workflow = categorify(LETTERS, out_path)
    request = {"item": np.array([None, None], dtype=object)}
    with pytest.raises(RuntimeError, match="Failed to categorical encode"):
        oracle(workflow, request)
    np.testing.assert_array_equal(compile_workflow(workflow).transform(request)["item"], [1, 1])


def test_categorify_of_numbers_against_a_string_vocabulary_runs_through_nvtabular(out_path):
    workflow = categorify(LETTERS, out_path)
    request = {"item": np.array([1, 2, 3])}
    got = compile_workflow(workflow).transform(request)
    np.testing.assert_array_equal(got["item"], [2, 2, 2])
    assert_wire_equal(got, oracle(workflow, request))


def test_categorify_encodes_ragged_list_inputs_element_by_element(out_path):
    train = pd.DataFrame({"tags": [["b", "a"], ["b"], ["c", "b", "a"]]})
    workflow = categorify(train, out_path)
    request = {
        "tags" + VALUES: np.array(["a", None, "zzz", "b", "c"], dtype=object),
        "tags" + OFFSETS: np.array([0, 3, 3, 5], dtype=np.int32),
    }
    got = compile_workflow(workflow).transform(request)
    # inside lists a null is only a value missing from the vocabulary: label 2, not 1
    np.testing.assert_array_equal(got["tags" + VALUES], [4, 2, 2, 3, 5])
    numeric = categorify(
        pd.DataFrame({"tags": [[2.0, 1.0], [2.0], [3.0, 2.0, 1.0]]}), out_path + "/numeric"
    )
    numbers = {
        "tags" + VALUES: np.array([1.0, np.nan, 9.0, 2.0, 3.0]),
        "tags" + OFFSETS: np.array([0, 3, 3, 5], dtype=np.int32),
    }
    assert_wire_equal(run_module(scripted_module(numeric), numbers), oracle(numeric, numbers))
    np.testing.assert_array_equal(got["tags" + OFFSETS], [0, 3, 3, 5])
    assert_wire_equal(got, oracle(workflow, request))


# NVTabular warns that hashing differs between CPU and GPU; this test hashes on purpose.
@pytest.mark.filterwarnings("ignore:Performing a hash-based transformation:UserWarning:nvtabular")
def test_categorify_with_num_buckets_runs_through_nvtabular_and_says_why(out_path, caplog):
    workflow = categorify(LETTERS, out_path, max_size=6, num_buckets=3)
    with caplog.at_level("WARNING", logger="merlin_torch_serving"):
        compiled = compile_workflow(workflow)
    assert compiled.fallbacks == [
        ("Categorify", "num_buckets hashes out-of-vocabulary values of 'item'")
    ]
    assert [r.getMessage() for r in caplog.records if "Categorify" in r.getMessage()] == [
        "fast path: operator 'Categorify' runs through NVTabular: num_buckets hashes"
        " out-of-vocabulary values of 'item'"
    ]
    request = {"item": np.array(["a", "b", "zz", "yy"], dtype=object)}
    assert_wire_equal(compiled.transform(request), oracle(workflow, request))


@pytest.mark.parametrize("encode_type", ["joint", "combo"])
def test_categorify_of_a_column_group_runs_through_nvtabular(out_path, encode_type):
    train = pd.DataFrame({"a": ["x", "y", "x"], "b": ["y", "z", "z"]})
    workflow = fit(
        [["a", "b"]] >> nvt.ops.Categorify(out_path=out_path, encode_type=encode_type), train
    )
    compiled = compile_workflow(workflow)
    assert len(compiled.fallbacks) == 1
    assert compiled.fallbacks[0][0] == "Categorify"
    request = {"a": np.array(["x", "z"], dtype=object), "b": np.array(["y", "q"], dtype=object)}
    assert_wire_equal(compiled.transform(request), oracle(workflow, request))


NUMBERS = pd.DataFrame({"item": [11, 11, 11, 11, 5, 5, 5, 7, 7, 9]})


def rewrite_vocabulary_index_from_zero(workflow: nvt.Workflow, column: str) -> None:
    """Store the vocabulary with an index from 0 (as cudf, or older writers, leave it)."""
    path = workflow.output_node.op.categories[column]
    pd.read_parquet(path).reset_index(drop=True).to_parquet(path)


@pytest.mark.parametrize("index_from_zero", [False, True], ids=["index-from-3", "index-from-0"])
@pytest.mark.parametrize("split_out", [1, 2])
def test_categorify_encodes_a_vocabulary_written_either_way_like_nvtabular_and_decodes_it_back(
    out_path, split_out, index_from_zero, caplog
):
    workflow = categorify(NUMBERS, out_path, split_out=split_out)
    if index_from_zero:
        rewrite_vocabulary_index_from_zero(workflow, "item")
    compiled = compile_workflow(workflow)
    assert compiled.fallbacks == []  # split_out > 1 written as one file is compiled too
    request = {"item": np.array([5, 7, 9, 11, 13, 11], dtype=np.int64)}

    got = compiled.transform(request)
    assert_wire_equal(got, oracle(workflow, request))
    # NVTabular shifts an index from 0 past the reserved ids only with split_out=1
    shifted = not index_from_zero or split_out == 1
    assert got["item"].tolist() == ([4, 5, 6, 3, 2, 3] if shifted else [1, 2, 3, 0, 2, 0])

    # decoding reads the same labels: every known value comes back
    decoded = CategoryVocabulary.from_workflow(workflow, "item").decode(got["item"])
    known = [0, 1, 2, 3, 5]
    assert decoded[known].tolist() == [5, 7, 9, 11, 11]
    if shifted:
        assert decoded[4] == -1  # the unseen 13: out of vocabulary
    # unshifted, the vocabulary's ids collide with the reserved ones, and the library says so
    collides = any(
        "share ids with padding, null and out-of-vocabulary" in r.getMessage()
        for r in caplog.records
    )
    assert collides == (not shifted)


@settings(max_examples=40, deadline=None)
@given(items=st.lists(st.sampled_from([5, 7, 9, 11, 12, 0, -3]), min_size=1, max_size=30))
def test_categorify_with_split_out_equals_nvtabular_on_random_requests(split_out_workflow, items):
    request = {"item": np.array(items, dtype=np.int64)}
    assert_wire_equal(
        compile_workflow(split_out_workflow).transform(request), oracle(split_out_workflow, request)
    )


@pytest.fixture(scope="module")
def split_out_workflow(tmp_path_factory):
    return categorify(NUMBERS, str(tmp_path_factory.mktemp("split_out")), split_out=3)
