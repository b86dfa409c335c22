"""Triton's pytorch backend, as the project builds it, serving an AOTInductor package (tests/
aot_models.py's tiny one) from a server whose backend folder holds the pytorch backend alone:
inputs found by name whatever order the config and the request list them in, two instances, Triton's
dynamic batching, a request the package refuses answered with its message while the server goes
on, and loads refused where the config and the package disagree or the package needs CPU features
this CPU lacks. Every answer equals what the same package answers in this process, bit for bit.
Then the toy session graph with its model compiled into a package: a batched export answering its
package step request by request, and an export compiled for x86-64-v3, whose code uses no AVX-512
register, answering as this process answers with packages compiled alike."""

from __future__ import annotations

import subprocess
import tempfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from merlin_torch_serving import (
    Client,
    Ensemble,
    LocalExecutor,
    ModelOptions,
    PredictPytorch,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.aot.package import CompiledPackage
from merlin_torch_serving.exceptions import ModelLoadError
from tests import toy_session
from tests.aot_models import (
    MISSING_FLAG,
    TINY_REFUSAL,
    asking_for_missing_feature,
    tiny_example,
    write_package_model,
)
from tests.served import assert_frames_equal, batches_formed, concurrent_answers, frames_equal

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


def _toy_ensemble(toy_workflow, toy_model) -> Ensemble:
    """The toy session graph with its eager model compiled into a package with its top k."""
    _, model_inputs, model_outputs = toy_model
    features = toy_workflow.input_schema.column_names >> TransformWorkflow(toy_workflow)
    top = (
        features
        >> PredictPytorch(
            toy_session.eager_model(toy_workflow),
            model_inputs,
            model_outputs,
            backend="pytorch",
            compiled="package",
        )
        >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
    )
    return Ensemble(features["session_id"] + top, toy_workflow.input_schema)


def _requests() -> list:
    return [toy_session.interactions(n, seed=n, first_session=10_000 * n) for n in (1, 2, 5, 9)]


def test_a_batched_export_serves_its_package_step_request_by_request_as_in_process(
    triton_server, toy_workflow, toy_model
):
    # for x86-64-v3, as the next test's export: the in-process runs of both share one package
    ensemble = _toy_ensemble(toy_workflow, toy_model)
    name = "package-batched"
    options = ModelOptions(batching=True, instruction_set="x86-64-v3")
    result = ensemble.export(triton_server.repository, name, options=options)
    triton_server.load(name)
    requests = _requests()
    executor = LocalExecutor(instruction_set="x86-64-v3")
    expected = [ensemble.transform(rows, executor) for rows in requests]

    answers = concurrent_answers(triton_server.grpc_url, "grpc", name, requests, 2, threads=6)

    wrong = [index for index, answer in answers if not frames_equal(answer, expected[index])]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers differ"
    assert any(
        "AOTInductor packages do not merge a batch's requests yet" in warning
        for warning in result.warnings
    )


def test_an_export_for_x86_64_v3_needs_no_avx512_and_answers_as_in_process_compiled_alike(
    triton_server, toy_workflow, toy_model
):
    ensemble = _toy_ensemble(toy_workflow, toy_model)
    name = "package-x86-64-v3"
    options = ModelOptions(instruction_set="x86-64-v3")
    ensemble.export(triton_server.repository, name, options=options)
    triton_server.load(name)
    [path] = Path(triton_server.repository).glob(f"{name}-*/1/model.pt2")

    package = CompiledPackage(path, name)
    required = package.metadata["required_cpu_flags"].split()
    assert {"avx2", "fma"} <= set(required)
    assert not [flag for flag in required if flag.startswith("avx512")]
    assert package.metadata["instruction_set"] == "x86-64-v3"
    assert not _instructions_on_zmm_registers(path), "AVX-512 code in an x86-64-v3 package"
    executor = LocalExecutor(instruction_set="x86-64-v3")
    with Client(triton_server.grpc_url) as client:
        for rows in _requests():
            assert_frames_equal(client.infer(name, rows), ensemble.transform(rows, executor))


def _instructions_on_zmm_registers(package: Path) -> list[str]:
    """The lines of the package's compiled code (objdump) that use AVX-512's zmm registers."""
    with tempfile.TemporaryDirectory() as folder, zipfile.ZipFile(package) as archive:
        libraries = [name for name in archive.namelist() if name.endswith(".so")]
        found = []
        for name in libraries:
            library = archive.extract(name, folder)
            listing = subprocess.run(
                ["objdump", "-d", "--no-show-raw-insn", library],
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            ).stdout
            found += [line for line in listing.splitlines() if "%zmm" in line]
    assert libraries, "no compiled library in the package"
    return found
