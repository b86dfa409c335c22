"""A package loaded in this process: inputs found by the name its call spec gives them whatever the
order a caller lists them in, each checked against the dtype and rank it was compiled for, a request
it refuses refused with the message naming the column, and a package compiled for CPU features this
CPU lacks refused before it runs, naming them and the fix."""

from __future__ import annotations

import json

import pytest
import torch

from merlin_torch_serving.aot.package import CompiledPackage, input_names
from merlin_torch_serving.exceptions import InputError, PackageError
from tests.aot_models import (
    MISSING_FLAG,
    TINY_REFUSAL,
    Tiny,
    asking_for_missing_feature,
    tiny_example,
)


def test_inputs_are_taken_by_name_in_the_order_the_package_records(tiny_package):
    package = CompiledPackage(tiny_package, "Tiny")
    example = tiny_example(rows=5)
    reordered = {"a": example["a"], "b": example["b"]}  # not the package's order

    outputs = package(reordered)

    assert package.input_names == ["b", "a"]
    expected = Tiny()(example)
    assert [output.shape for output in outputs] == [torch.Size([5, 3])] * 2
    torch.testing.assert_close(outputs[0], expected[0])
    assert torch.equal(outputs[1], expected[1])


@pytest.mark.parametrize("rows", [0, 1, 2, 17])
def test_a_package_answers_any_number_of_rows(tiny_package, rows):
    package = CompiledPackage(tiny_package, "Tiny")
    outputs = package(tiny_example(rows))
    assert [output.shape[0] for output in outputs] == [rows, rows]


def test_an_input_of_another_dtype_is_refused_naming_it(tiny_package):
    package = CompiledPackage(tiny_package, "Tiny")
    example = tiny_example()
    example["b"] = example["b"].to(torch.int32)
    with pytest.raises(
        InputError,
        match=r"input column 'b': expected a 2-dimensional tensor of int64, got a 2-dimensional"
        r" tensor of torch\.int32",
    ):
        package(example)


def test_a_missing_input_is_refused_naming_it(tiny_package):
    package = CompiledPackage(tiny_package, "Tiny")
    with pytest.raises(InputError, match=r"input column 'a': expected a tensor, got no such input"):
        package({"b": tiny_example()["b"]})


def test_a_request_the_package_refuses_raises_its_message_naming_the_column(tiny_package):
    package = CompiledPackage(tiny_package, "Tiny")
    example = tiny_example()
    example["b"][1, 2] = -4
    with pytest.raises(RuntimeError) as refused:
        package(example)
    assert InputError.from_message(str(refused.value).splitlines()[-1]).column == "b"
    assert TINY_REFUSAL in str(refused.value)


def test_the_package_records_the_cpu_features_its_code_needs(tiny_package):
    package = CompiledPackage(tiny_package, "Tiny")
    required = package.metadata["required_cpu_flags"].split()
    assert "sse2" in required
    assert package.metadata["instruction_set"].startswith("native (")


def test_a_package_for_cpu_features_this_cpu_lacks_is_refused_naming_them_and_the_fix(
    tiny_package, tmp_path
):
    foreign = asking_for_missing_feature(tiny_package, tmp_path / "foreign.pt2")
    with pytest.raises(
        PackageError,
        match=(
            rf"Tiny: the package '.*foreign\.pt2' was compiled for the instruction set native .*"
            rf" and needs the CPU feature\(s\) {MISSING_FLAG}, which this CPU lacks; export it"
            r" again for an instruction set this CPU has \(ModelOptions\(instruction_set="
            r"'x86-64-v3'\), or 'x86-64' for any x86-64 CPU\)"
        ),
    ):
        CompiledPackage(foreign, "Tiny")


def test_a_file_that_is_no_package_is_named(tmp_path):
    path = tmp_path / "model.pt2"
    path.write_bytes(b"not a zip")
    with pytest.raises(PackageError, match=r"Tiny: '.*model\.pt2' is not an AOTInductor package"):
        CompiledPackage(path, "Tiny")


def _spec(node) -> str:
    return json.dumps([1, node])


def _leaf():
    return {"type": None, "context": None, "children_spec": []}


def _dict(*keys):
    return {
        "type": "builtins.dict",
        "context": json.dumps(list(keys)),
        "children_spec": [_leaf() for _ in keys],
    }


def _tuple(*children):
    return {"type": "builtins.tuple", "context": "null", "children_spec": list(children)}


def test_input_names_are_the_keys_of_the_dict_argument_and_of_keyword_arguments_in_order():
    spec = _spec(_tuple(_tuple(_dict("z", "a")), _dict("k")))
    assert input_names(spec) == ["z", "a", "k"]


def test_a_positional_tensor_argument_has_no_name_and_is_refused():
    spec = _spec(_tuple(_tuple(_leaf()), _dict()))
    with pytest.raises(PackageError, match="input number 0 is a positional argument"):
        input_names(spec)
