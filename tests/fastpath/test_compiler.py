"""compile_workflow's contract: what it accepts, what it reports, how it rejects bad requests."""

from __future__ import annotations

import re

import numpy as np
import nvtabular as nvt
import pandas as pd
import pytest

from merlin_torch_serving.exceptions import InputError
from merlin_torch_serving.fastpath import CompiledWorkflow, compile_workflow
from tests.fastpath.helpers import OFFSETS, VALUES, assert_wire_equal, fit, oracle

REQUEST = {
    "session_id": np.array([1, 1]),
    "timestamp": np.array([2, 1]),
    "item_id": np.array([5, 6]),
    "category": np.array([0, 1]),
}


def test_compile_workflow_rejects_what_is_not_a_workflow():
    with pytest.raises(TypeError, match=re.escape("takes a fitted nvtabular.Workflow, got dict")):
        compile_workflow({})


def test_compile_workflow_rejects_a_workflow_that_was_never_fitted(tmp_path):
    workflow = nvt.Workflow(["item"] >> nvt.ops.Categorify(out_path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"has no schemas yet; fit it \(workflow.fit\(dataset\)\)"):
        compile_workflow(workflow)


def test_compiled_workflow_exposes_the_workflow_schemas(session_workflow, compiled_session):
    assert isinstance(compiled_session, CompiledWorkflow)
    assert compiled_session.input_schema == session_workflow.input_schema
    assert compiled_session.output_schema == session_workflow.output_schema


def test_transform_names_the_missing_input_column(compiled_session):
    request = {name: values for name, values in REQUEST.items() if name != "category"}
    with pytest.raises(
        InputError, match=r"input column 'category': expected an array .* missing: \['category'\]"
    ):
        compiled_session.transform(request)


def test_transform_names_the_column_whose_row_count_differs(compiled_session):
    expected = (
        r"input column 'item_id': expected 2 rows, like 'timestamp', 'category', 'session_id', got"
        r" 3 rows"
    )
    with pytest.raises(InputError, match=expected):
        compiled_session.transform({**REQUEST, "item_id": np.array([5, 6, 7])})


def test_transform_rejects_two_dimensional_inputs_and_says_how_to_send_lists(compiled_session):
    with pytest.raises(
        InputError, match=r"'item_id': expected a 1-D array .* shape \(2, 1\).*'item_id__values'"
    ):
        compiled_session.transform({**REQUEST, "item_id": np.array([[5], [6]])})


def test_transform_rejects_offsets_that_do_not_cover_the_values(tmp_path):
    workflow = fit(["tags"] >> nvt.ops.ListSlice(2), pd.DataFrame({"tags": [[1, 2], [3]]}))
    expected = (
        r"'tags__offsets': expected non-decreasing integer offsets .* got offsets from 0 to 2 for 3"
        r" values"
    )
    with pytest.raises(InputError, match=expected):
        compile_workflow(workflow).transform(
            {"tags" + VALUES: np.array([1, 2, 3]), "tags" + OFFSETS: np.array([0, 2])}
        )


def test_transform_takes_fixed_width_strings_like_object_strings(tmp_path):
    workflow = fit(
        ["item"] >> nvt.ops.Categorify(out_path=str(tmp_path)),
        pd.DataFrame({"item": ["a", "b", "b"]}),
    )
    compiled = compile_workflow(workflow)
    as_unicode = compiled.transform({"item": np.array(["b", "a", "zz"])})
    as_objects = {"item": np.array(["b", "a", "zz"], dtype=object)}
    assert_wire_equal(as_unicode, compiled.transform(as_objects))
    assert_wire_equal(as_unicode, oracle(workflow, as_objects))


def test_transform_does_not_modify_the_request(compiled_session):
    request = {name: values.copy() for name, values in REQUEST.items()}
    compiled_session.transform(request)
    for name, values in REQUEST.items():
        np.testing.assert_array_equal(request[name], values)


def test_transform_rejects_list_rows_in_an_object_array_and_says_how_to_send_lists(
    compiled_session,
):
    rows = np.empty(2, dtype=object)
    rows[0], rows[1] = [5], [6]
    with pytest.raises(
        InputError, match=r"'item_id': expected a 1-D array .* got an object array of lists"
    ):
        compiled_session.transform({**REQUEST, "item_id": rows})


def test_a_saved_and_loaded_workflow_compiles_with_its_copied_vocabularies(
    session_workflow, tmp_path
):
    session_workflow.save(str(tmp_path / "workflow"))
    loaded = nvt.Workflow.load(str(tmp_path / "workflow"))
    compiled = compile_workflow(loaded)
    assert compiled.fallbacks == []
    assert_wire_equal(compiled.transform(REQUEST), oracle(session_workflow, REQUEST))
