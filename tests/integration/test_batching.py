"""Cross-request batching on the real tritonserver: the session example exported with
``ModelOptions(batching=True)`` (all-python, and mixed with the model on libtorch) answers many
concurrent requests of different shapes, each with its own answer, equal bit for bit to the same
request answered by the unbatched export and by ``Ensemble.transform``; Triton's statistics show
that it formed batches of more than one request.
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest
import tritonclient.http

from examples.session_based.demo import recommendation_graph
from merlin_torch_serving import Client, Ensemble, ModelOptions
from merlin_torch_serving.launcher import access
from tests.served import assert_frames_equal, frames_equal
from tests.session_models import SERVED_TORCH_THREADS, request_rows, torch_threads

pytestmark = pytest.mark.integration

BATCHED = ModelOptions(batching=True)


@pytest.fixture(scope="module")
def exports(triton_server, session_workflow, xlnet, pytorch_backend):
    """name -> ensemble: all-python batched and not, mixed batched (the unbatched mixed export is
    compared with in-process in test_libtorch_serving.py)."""
    made = {}
    for backend, batched in (("python", True), ("python", False), ("pytorch", True)):
        ensemble = Ensemble(
            recommendation_graph(session_workflow, xlnet.served, backend=backend),
            session_workflow.input_schema,
        )
        name = f"batching-{backend}-{'on' if batched else 'off'}"
        ensemble.export(
            triton_server.repository, name, options=BATCHED if batched else ModelOptions()
        )
        triton_server.load(
            name, timeout_s=300.0
        )  # a step imports torch and merlin-core: slow on a busy machine
        made[name] = ensemble
    return made


@pytest.fixture(scope="module")
def requests(session_split, session_workflow):
    """Requests of 1, 7 and 64 sessions (the longest session, longer than the model's window, and a
    single-click one among them), one of no clicks, and two that share a session id. The others
    hold sessions of their own (ids moved apart), so that steps merge them."""
    _, held_out = session_split
    made = [request_rows(held_out, n, seed=n) for n in (1, 7, 64, 2, 3)]
    for i, rows in enumerate(made):
        rows["session_id"] += i * 1_000_000
    made.append(held_out.iloc[:0][session_workflow.input_schema.column_names].copy())
    first = made[1][made[1]["session_id"] == made[1]["session_id"].iloc[0]]
    made.append(first.iloc[::-1].reset_index(drop=True))  # the same session id, other clicks order
    return made


@pytest.fixture(scope="module")
def expected(exports, requests):
    ensemble = exports["batching-python-off"]
    with torch_threads(SERVED_TORCH_THREADS):
        return [ensemble.transform(rows) for rows in requests]


def _concurrent_answers(
    url: str, protocol: str, model: str, requests, rounds: int, threads: int
) -> list:
    """(request index, answer) for every request sent by ``threads`` clients at once, each sending
    every request ``rounds`` times in an order of its own."""
    answers, errors = [], []
    start = threading.Barrier(threads)

    def send(seed: int) -> None:
        order = np.random.default_rng(seed).permutation(np.tile(np.arange(len(requests)), rounds))
        with Client(url, protocol, retries=0) as client:
            start.wait()
            for index in order:
                try:
                    answers.append((int(index), client.infer(model, requests[index])))
                except Exception as error:
                    errors.append(f"request {index}: {type(error).__name__}: {error}")

    workers = [threading.Thread(target=send, args=(seed,)) for seed in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)
    assert not errors, errors[:3]
    assert len(answers) == threads * rounds * len(requests)
    return answers


@pytest.mark.parametrize("backend", ["python", "pytorch"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_concurrent_batched_answers_equal_unbatched_and_in_process(
    triton_server, exports, requests, expected, backend, protocol
):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    with Client(url, protocol) as client:
        for rows, want in zip(requests, expected, strict=True):
            assert_frames_equal(client.infer("batching-python-off", rows), want)

    answers = _concurrent_answers(
        url, protocol, f"batching-{backend}-on", requests, rounds=3, threads=12
    )

    wrong = [index for index, answer in answers if not frames_equal(answer, expected[index])]
    assert not wrong, (
        f"{len(wrong)} of {len(answers)} answers differ from their own request's, e.g. request "
        f"{wrong[0]}"
    )
    assert {len(answer) for index, answer in answers if index == len(requests) - 2} == {
        0
    }  # no clicks, no sessions


@pytest.mark.parametrize(
    ("ensemble", "step"),
    [
        ("batching-python-on", "0-transformworkflow_predictpytorch_topk_decodeitemids"),
        ("batching-pytorch-on", "1-predictpytorch_topk_decodeitemids"),  # libtorch
    ],
)
def test_triton_forms_batches_of_several_requests(triton_server, exports, requests, ensemble, step):
    _concurrent_answers(
        triton_server.grpc_url, "grpc", ensemble, requests[:1] * 4, rounds=8, threads=16
    )

    client = tritonclient.http.InferenceServerClient(triton_server.http_url)
    try:
        stats = client.get_inference_statistics(
            f"{ensemble}-{step}", headers=access.headers(triton_server.admin_key)
        )["model_stats"][0]
    finally:
        client.close()
    formed = {
        int(entry["batch_size"]): int(entry["compute_infer"]["count"])
        for entry in stats["batch_stats"]
    }
    assert max(formed) > 1, f"batch sizes formed: {formed}"
    assert int(stats["execution_count"]) < int(stats["inference_count"])  # fewer runs than requests


def test_batched_form_is_refused_plainly_to_a_client_that_sends_merlins_form(
    triton_server, exports, requests, session_workflow
):
    """Merlin Systems' ``send_triton_request`` sends ``[n]`` tensors: it works with unbatched
    exports (tests/integration/test_session_recommendations.py) and is refused by batched ones."""
    from merlin.systems.triton.utils import send_triton_request

    rows = requests[1][session_workflow.input_schema.column_names]
    outputs = Client(triton_server.grpc_url).schemas("batching-python-on").response_names
    with pytest.raises(Exception, match=r"shape|dims|dimension"):
        send_triton_request(
            session_workflow.input_schema,
            rows,
            list(outputs.values()),
            endpoint=triton_server.grpc_url,
            triton_model="batching-python-on",
        )
    answer = send_triton_request(
        session_workflow.input_schema,
        rows,
        list(outputs.values()),
        endpoint=triton_server.grpc_url,
        triton_model="batching-python-off",
    )
    assert answer[outputs["session_id"]].tolist() == list(pd.unique(rows["session_id"]))
