"""Triton's pytorch backend, as the project builds it, serving an AOTInductor package (tests/
aot_models.py's tiny one) from a server whose backend folder holds the pytorch backend alone:
inputs found by name whatever order the config and the request list them in, two instances, Triton's
dynamic batching, a request the package refuses answered with its message while the server goes
on, and loads refused where the config and the package disagree or the package needs CPU features
this CPU lacks. Every answer equals what the same package answers in this process, bit for bit."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from merlin_torch_serving.aot.package import CompiledPackage
from merlin_torch_serving.exceptions import ModelLoadError
from tests.aot_models import (
    MISSING_FLAG,
    TINY_REFUSAL,
    asking_for_missing_feature,
    tiny_example,
    write_package_model,
)
from tests.served import batches_formed

pytestmark = pytest.mark.integration

OUTPUTS = ("doubled", "next")


@pytest.fixture(scope="module")
def served(pytorch_only_server, tiny_package):
    repository = pytorch_only_server.repository
    write_package_model(repository, "tiny", tiny_package, instances=2)
    write_package_model(repository, "tiny-batched", tiny_package, max_batch_size=16)
    for name in ("tiny", "tiny-batched"):
        pytorch_only_server.load(name)
    return pytorch_only_server


def _infer(url: str, model: str, arrays: dict) -> dict:
    client = grpcclient.InferenceServerClient(url)
    try:
        inputs = []
        for name, array in arrays.items():  # in the order given
            tensor = grpcclient.InferInput(
                name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64"
            )
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer(model, inputs)
        return {name: result.as_numpy(name) for name in OUTPUTS}
    finally:
        client.close()


def _in_process(tiny_package, arrays: dict) -> dict:
    import torch

    outputs = CompiledPackage(tiny_package, "Tiny")(
        {name: torch.from_numpy(array) for name, array in arrays.items()}
    )
    return {name: output.numpy() for name, output in zip(OUTPUTS, outputs, strict=True)}


def _arrays(rows: int, shift: int = 0) -> dict:
    return {name: tensor.numpy() + shift for name, tensor in tiny_example(rows).items()}


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_inputs_reach_the_package_by_name_whatever_the_order_of_config_and_request(
    served, tiny_package, order
):
    arrays = _arrays(rows=4)
    sent = {name: arrays[name] for name in order}

    answer = _infer(served.grpc_url, "tiny", sent)

    expected = _in_process(tiny_package, arrays)
    for name in OUTPUTS:
        np.testing.assert_array_equal(answer[name], expected[name])
    # a by position would have read b's int64 bytes as floats: doubled would not be a * 2 + b
    np.testing.assert_allclose(answer["doubled"], arrays["a"] * 2 + arrays["b"])


def test_a_request_the_package_refuses_is_answered_with_its_message_and_the_server_goes_on(
    served, tiny_package
):
    bad = _arrays(rows=2)
    bad["b"][1, 1] = -7

    with pytest.raises(InferenceServerException, match=TINY_REFUSAL):
        _infer(served.grpc_url, "tiny", bad)

    assert all(model.healthy for model in served.health() if model.name.startswith("tiny"))
    good = _arrays(rows=3)
    np.testing.assert_array_equal(
        _infer(served.grpc_url, "tiny", good)["next"], _in_process(tiny_package, good)["next"]
    )


def test_concurrent_requests_are_batched_by_triton_and_each_answered_its_own(served, tiny_package):
    requests = [_arrays(rows=1 + index % 4, shift=index) for index in range(48)]
    answers: dict[int, dict] = {}
    errors: list[str] = []

    def send(indexes):
        for index in indexes:
            try:
                answers[index] = _infer(served.grpc_url, "tiny-batched", requests[index])
            except Exception as error:
                errors.append(f"{index}: {error}")

    threads = [threading.Thread(target=send, args=(range(i, 48, 8),)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert not errors, errors[:3]
    for index, arrays in enumerate(requests):
        expected = _in_process(tiny_package, arrays)
        for name in OUTPUTS:
            np.testing.assert_array_equal(answers[index][name], expected[name], err_msg=name)
    formed = batches_formed(served.http_url, "tiny-batched", served.admin_key)
    assert max(formed) > 1, f"batch sizes formed: {formed}"


def test_a_config_input_the_package_does_not_take_fails_the_load_naming_it(
    pytorch_only_server, tiny_package
):
    write_package_model(
        pytorch_only_server.repository, "tiny-wrong-input", tiny_package, inputs=("a", "c")
    )
    with pytest.raises(
        ModelLoadError,
        match=r"configuration's input 'c' is not an input of its package, which takes 'b', 'a'",
    ):
        pytorch_only_server.load("tiny-wrong-input")


def test_a_package_for_cpu_features_this_cpu_lacks_fails_the_load_naming_them_and_the_fix(
    pytorch_only_server, tiny_package, tmp_path
):
    foreign = asking_for_missing_feature(tiny_package, tmp_path / "foreign.pt2")
    write_package_model(pytorch_only_server.repository, "tiny-foreign", foreign)
    with pytest.raises(ModelLoadError) as refused:
        pytorch_only_server.load("tiny-foreign")
    message = str(refused.value)
    assert f"needs the CPU feature(s) {MISSING_FLAG}, which this CPU lacks" in message
    assert 'ModelOptions(instruction_set=\\"x86-64-v3\\")' in message or (
        'ModelOptions(instruction_set="x86-64-v3")' in message
    )
