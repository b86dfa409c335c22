"""The schema-driven clients and the Triton executor against the real tritonserver: every test of
a ``client`` runs on ``Client`` and on ``AsyncClient`` (driven from the test's thread) over both
protocols, with the same answers and the same errors; ``AsyncClient`` answers a hundred concurrent
coroutines, and a call cancelled while the server computes it leaves both usable."""

import asyncio
import socket

import numpy as np
import pandas as pd
import pytest

from merlin_torch_serving import (
    AddressError,
    AsyncClient,
    Client,
    InferenceError,
    InputError,
    RequestTimeoutError,
    ServerUnavailableError,
    TritonExecutor,
    UnknownModelError,
    WrongProtocolError,
)
from merlin_torch_serving.data import frames
from tests import toy_session
from tests.served import AwaitedClient, assert_frames_equal

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(toy_client):
    return toy_client


CLIENTS = {"Client": Client, "AsyncClient": AwaitedClient}


def url_of(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


@pytest.fixture(
    params=[(kind, protocol) for kind in CLIENTS for protocol in ("grpc", "http")],
    ids="-".join,
)
def client(request, triton_server):
    kind, protocol = request.param
    with CLIENTS[kind](url_of(triton_server, protocol), protocol=protocol) as client:
        yield client


def test_client_reads_schemas_from_the_server(served, client):
    schemas = client.schemas("toy-client")
    assert schemas.input_schema.column_names == served.input_schema.column_names
    assert schemas.output_schema.column_names == ["session_id", "item_ids", "item_scores"]
    assert schemas.response_names["session_id"] == "session_id__out"


def test_client_answers_one_row_per_session_in_request_order(served, client):
    rows = toy_session.interactions(12, seed=21, first_session=7000).sample(
        frac=1.0, random_state=3
    )
    answer = client.infer("toy-client", rows)
    assert answer["session_id"].tolist() == list(pd.unique(rows["session_id"]))
    assert_frames_equal(answer, served.transform(rows))


def test_client_accepts_a_dict_of_lists_and_safe_casts(served, client):
    rows = toy_session.interactions(3, seed=22)
    as_dict = {name: rows[name].astype("int32").tolist() for name in rows.columns}
    assert_frames_equal(client.infer("toy-client", as_dict), served.transform(rows))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_triton_executor_runs_the_ensemble_through_the_same_call(served, triton_server, protocol):
    rows = toy_session.interactions(5, seed=23)
    with Client(url_of(triton_server, protocol), protocol) as client:
        remote = served.transform(rows, executor=TritonExecutor(client, "toy-client"))
    assert_frames_equal(remote, served.transform(rows))


def test_client_names_a_missing_column(served, client):
    rows = toy_session.interactions(2, seed=24).drop(columns=["timestamp"])
    with pytest.raises(
        InputError, match="missing input columns: 'timestamp' \\(int64 scalar\\); the request has"
    ):
        client.infer("toy-client", rows)


def test_client_names_an_extra_column_of_a_request_table_before_sending(served, client):
    # a server refuses an input it does not declare in its own words, without naming it
    rows = toy_session.interactions(2, seed=24).assign(price=1.5)
    with pytest.raises(
        InputError, match=r"input column 'price': expected no such column \(the inputs are"
    ):
        client.infer_table("toy-client", frames.frame_to_table(rows))


def test_client_maps_the_callers_column_names_to_the_inputs_and_back(served, client):
    rows = toy_session.interactions(3, seed=26)
    answer = client.infer(
        "toy-client", rows.rename(columns={"session_id": "visit"}), columns={"visit": "session_id"}
    )
    assert_frames_equal(answer, served.transform(rows).rename(columns={"session_id": "visit"}))


def test_client_refuses_a_mapping_of_a_column_the_request_lacks(served, client):
    with pytest.raises(
        InputError,
        match=(
            r"input column 'visit': expected a column of the request .*fix the mapping"
            r" visit=session_id"
        ),
    ):
        client.infer("toy-client", toy_session.interactions(1), columns={"visit": "session_id"})


def test_an_unknown_model_lists_the_models_the_server_has(served, client):
    with pytest.raises(
        UnknownModelError,
        match=r"^use one of the models this server has: .*'toy-client'.*; it has no model 'toy'$",
    ):
        client.infer("toy", toy_session.interactions(1))
    with pytest.raises(UnknownModelError, match="it has no model 'toy'"):
        client.wait_until_ready("toy", timeout_s=30)


@pytest.mark.parametrize(
    ("url", "protocol"), [("http://localhost:8000", "http"), ("grpc://localhost:8001/", "grpc")]
)
def test_an_address_with_a_scheme_is_refused_before_tritonclient_sees_it(url, protocol):
    address = url.split("://")[1].rstrip("/")
    with pytest.raises(
        AddressError, match=f"^drop the scheme: Client\\('{address}', protocol='{protocol}'\\)"
    ):
        Client(url, protocol)


def test_client_names_a_column_whose_values_do_not_convert(served, client):
    rows = toy_session.interactions(2, seed=25).astype({"item_id": "float64"})
    rows.loc[0, "item_id"] = 3.5
    with pytest.raises(
        InputError, match="input column 'item_id': expected int64 scalar, got float64 values"
    ):
        client.infer("toy-client", rows)


def test_client_names_a_list_where_a_value_is_expected(served, client):
    with pytest.raises(InputError, match="'session_id': expected int64 scalar, got a list per row"):
        client.infer(
            "toy-client",
            {"session_id": [[1, 2]], "item_id": [1], "category": [1], "timestamp": [1]},
        )


def test_rows_of_unequal_length_are_refused_before_sending(served, client):
    rows = toy_session.interactions(1, seed=26)
    request = {name: rows[name].tolist() for name in rows.columns}
    request["item_id"] = request["item_id"][:-1]
    with pytest.raises(
        InputError,
        match=f"'item_id': expected {len(rows)} rows, like 'timestamp', got {len(rows) - 1}",
    ):
        client.infer("toy-client", request)


def test_a_step_that_refuses_a_request_is_named_with_the_column_in_the_error_the_client_sees(
    served, client
):
    rows = toy_session.interactions(1, seed=26)
    request = frames.frame_to_table(rows[served.input_schema.column_names])
    request["item_id"] = frames.frame_to_table({"item_id": np.zeros(0, dtype=np.int64)})["item_id"]
    with pytest.raises(
        InputError,
        match=(
            r"model 'toy-client-0-transformworkflow_predictpytorch_topk' refused the request:"
            rf" input column 'item_id': expected {len(rows)} rows"
        ),
    ) as caught:
        client.infer_table("toy-client", request)
    assert caught.value.column == "item_id"


def test_an_unknown_model_is_an_inference_error_naming_it(client):
    with pytest.raises(InferenceError, match="'no-such-model'"):
        client.schemas("no-such-model")


@pytest.fixture(scope="module")
def slow_model(triton_server):
    from tests.triton_models import write_python_model

    write_python_model(
        triton_server.repository,
        "slow",
        inputs={"x": ("TYPE_INT64", [-1])},
        outputs={"y": ("TYPE_INT64", [-1])},
        compute="time.sleep(3)\nreturn {'y': inputs['x']}",
    )
    triton_server.load("slow")
    return "slow"


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_request_slower_than_the_timeout_is_a_request_timeout_error(
    triton_server, slow_model, protocol, kind
):
    with CLIENTS[kind](url_of(triton_server, protocol), protocol, timeout_s=0.5) as client:
        client.schemas(slow_model)  # metadata answers at once
        with pytest.raises(
            RequestTimeoutError,
            match=r"inference on 'slow' failed: no answer within timeout_s=0\.5 s",
        ):
            client.infer(slow_model, {"x": [1, 2]})


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_server_that_is_not_there_is_server_unavailable_after_the_retries(protocol, monkeypatch):
    from merlin_torch_serving.client import conversation

    waits = []
    monkeypatch.setattr(conversation.time, "sleep", waits.append)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens on it
    with (
        Client(url, protocol, retries=2) as client,
        pytest.raises(ServerUnavailableError, match=rf"tritonserver at {url} is not available"),
    ):
        client.models()
    assert len(waits) == 2


def test_wait_until_ready_returns_once_the_model_answers_and_says_why_it_gave_up(
    triton_server, served
):
    with Client(triton_server.grpc_url) as client:
        client.wait_until_ready("toy-client", timeout_s=30)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens on it
    with Client(url) as client, pytest.raises(ServerUnavailableError) as gave_up:
        client.wait_until_ready("toy-client", timeout_s=0.5)
    first, second = str(gave_up.value).splitlines()[:2]
    assert first.startswith("start a server (`merlin-torch-serving serve REPOSITORY`")
    assert second.startswith(f"tritonserver at {url} is not available: not ready after 0.5 s: ")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_async_client_of_a_server_that_is_not_there_says_so_as_client_does(protocol):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens on it
    for kind in CLIENTS.values():
        with (
            kind(url, protocol, retries=1, retry_backoff_s=0.01) as client,
            pytest.raises(
                ServerUnavailableError, match=rf"^start a server .*\n.*{url} is not available"
            ),
        ):
            client.infer("toy-client", toy_session.interactions(1))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_hundred_concurrent_coroutines_of_one_async_client_each_get_their_own_answer(
    triton_server, served, protocol
):
    requests = [
        toy_session.interactions(1 + index % 7, seed=100 + index, first_session=20_000 + 99 * index)
        for index in range(100)
    ]

    async def ask() -> list:
        async with AsyncClient(url_of(triton_server, protocol), protocol) as client:
            return await asyncio.gather(*(client.infer("toy-client", rows) for rows in requests))

    answers = asyncio.run(ask())
    for rows, answer in zip(requests, answers, strict=True):
        assert_frames_equal(answer, served.transform(rows))


@pytest.fixture(scope="module")
def pausing_model(triton_server):
    """Answers ``x`` after a second: long enough to cancel a call while the server computes it."""
    from tests.triton_models import write_python_model

    write_python_model(
        triton_server.repository,
        "pausing",
        inputs={"x": ("TYPE_INT64", [-1])},
        outputs={"y": ("TYPE_INT64", [-1])},
        compute="time.sleep(1)\nreturn {'y': inputs['x'] + 1}",
    )
    triton_server.load("pausing")
    return "pausing"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_call_cancelled_while_the_server_computes_it_leaves_server_and_client_usable(
    triton_server, served, pausing_model, protocol
):
    rows = toy_session.interactions(3, seed=41)

    async def cancel_then_ask():
        async with AsyncClient(url_of(triton_server, protocol), protocol, retries=0) as client:
            await client.schemas(pausing_model)
            cancelled = asyncio.create_task(client.infer(pausing_model, {"x": [1, 2]}))
            await asyncio.sleep(0.3)  # sent, and the model is sleeping on it
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            left_running = asyncio.all_tasks() - {asyncio.current_task()}
            await client.wait_until_ready(pausing_model, timeout_s=30)
            return left_running, await asyncio.gather(
                client.infer(pausing_model, {"x": [5]}), client.infer("toy-client", rows)
            )

    left_running, (paused, answer) = asyncio.run(cancel_then_ask())
    assert left_running == set()
    assert paused["y"].tolist() == [6]
    assert_frames_equal(answer, served.transform(rows))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_client_on_the_other_protocols_port_is_told_so_as_client_is(triton_server, protocol):
    other = "http" if protocol == "grpc" else "grpc"
    url = url_of(triton_server, other)  # protocol's client on the other protocol's port
    for kind in CLIENTS.values():
        with (
            kind(url, protocol, retries=0) as client,
            pytest.raises(WrongProtocolError, match=rf"does not answer {protocol}: .*{other} port"),
        ):
            client.infer("toy-client", toy_session.interactions(1))


class IdleClosingProxy:
    """A TCP proxy in front of the server that closes a connection idle for ``idle_s`` (as load
    balancers do): the kept-alive connections of a client's pool die between its requests."""

    def __init__(self, upstream: str, idle_s: float):
        self.host, _, port = upstream.rpartition(":")
        self.port, self.idle_s = int(port), idle_s
        self.closed = 0

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info):
        self.server.close()

    async def _serve(self, client_reader, client_writer):
        upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.port)
        active = asyncio.Event()

        async def pipe(reader, writer):
            while data := await reader.read(65536):
                active.set()
                writer.write(data)
                await writer.drain()

        pipes = [
            asyncio.create_task(pipe(client_reader, upstream_writer)),
            asyncio.create_task(pipe(upstream_reader, client_writer)),
        ]
        while True:
            active.clear()
            try:
                await asyncio.wait_for(active.wait(), self.idle_s)
            except TimeoutError:
                break
        for task in pipes:
            task.cancel()
        self.closed += 1
        client_writer.close()
        upstream_writer.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_async_client_whose_idle_connections_were_closed_answers_on_new_ones(
    triton_server, served, protocol
):
    requests = [toy_session.interactions(1 + index, seed=60 + index) for index in range(3)]

    async def ask_with_pauses():
        proxy = IdleClosingProxy(url_of(triton_server, protocol), idle_s=0.2)
        async with proxy as url, AsyncClient(url, protocol, retries=0) as client:
            answers = []
            for rows in requests:
                answers.append(await client.infer("toy-client", rows))
                await asyncio.sleep(0.6)  # the proxy closes the connection meanwhile
            return answers, proxy.closed

    answers, closed = asyncio.run(ask_with_pauses())
    assert closed >= len(requests)  # every request after the first found its connection closed
    for rows, answer in zip(requests, answers, strict=True):
        assert_frames_equal(answer, served.transform(rows))


def test_an_async_clients_unused_http_connections_are_closed_after_a_while(
    triton_server, served, monkeypatch
):
    import psutil

    from merlin_torch_serving.client import async_http

    monkeypatch.setattr(async_http, "KEEP_IDLE_S", 0.3)
    port = int(triton_server.http_url.rpartition(":")[2])

    def open_to_server() -> int:
        return sum(
            1
            for connection in psutil.Process().net_connections("tcp")
            if connection.raddr
            and connection.raddr.port == port
            and connection.status == psutil.CONN_ESTABLISHED
        )

    async def ask_then_wait():
        async with AsyncClient(triton_server.http_url, "http") as client:
            await client.infer("toy-client", toy_session.interactions(2, seed=7))
            after_answer = open_to_server()
            await asyncio.sleep(1.0)
            return after_answer, open_to_server()

    after_answer, after_wait = asyncio.run(ask_then_wait())
    assert after_wait == after_answer - 1  # the inference connection; metadata's is aiohttp's


def test_waiting_for_a_model_ends_once_it_is_ready_though_another_failed_to_load(
    triton_server, served
):
    # Triton calls a server with a model that failed to load not ready, for good
    from merlin_torch_serving import ModelLoadError
    from tests.triton_models import write_python_model

    write_python_model(
        triton_server.repository,
        "fails-to-load",
        inputs={"x": ("TYPE_INT64", [-1])},
        outputs={"y": ("TYPE_INT64", [-1])},
        compute="return {'y': inputs['x']}",
        initialize="raise RuntimeError('broken on purpose')",
    )
    with pytest.raises(ModelLoadError):
        triton_server.load("fails-to-load")
    try:
        for protocol in ("grpc", "http"):
            for kind in CLIENTS.values():
                with kind(url_of(triton_server, protocol), protocol) as client:
                    client.wait_until_ready("toy-client", timeout_s=10)
                    with pytest.raises(ServerUnavailableError, match="the server is not ready"):
                        client.wait_until_ready(timeout_s=0.5)
    finally:
        triton_server.unload("fails-to-load")
