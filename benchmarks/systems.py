"""The systems under test, and for each the ways a client sends it one request.

A sender factory is called inside the thread that will use it (tritonclient's HTTP client must not
cross threads), with the server's URL, the protocol and that setting's request frames. It connects
(one metadata call) and returns ``send(i)``, which sends request ``i`` and waits for the whole
answer. An asynchronous path's factory is a coroutine function returning ``send`` (awaited) and its
client's ``close``, called once in the event loop whose coroutines share the client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from merlin.schema import Schema

from benchmarks.workload import RESERVED_IDS, TOP_K, Workload
from merlin_torch_serving import (
    AsyncClient,
    Client,
    DecodeItemIds,
    Ensemble,
    PredictPytorch,
    TopK,
    TransformWorkflow,
)
from merlin_torch_serving.data import frames, wire

PROJECT_MODEL = "session_recs"
MIXED_MODEL = "session_recs_mixed"
LIBTORCH_MODEL = "session_recs_libtorch"
PACKAGE_MODEL = "session_recs_package"
# A request that takes longer than this fails the run rather than stalling it.
REQUEST_TIMEOUT_S = 60.0

Sender = Callable[[int], None]
SenderFactory = Callable[[str, str, list[pd.DataFrame]], Sender]


@dataclass(frozen=True)
class ClientPath:
    """One way of sending requests: what the user's code does per request. ``asynchronous``:
    ``make_sender`` is an asyncio one (see ``async_load``), and its concurrency counts coroutines
    of one event loop rather than threads. ``sessions`` and ``concurrencies``: the only settings
    it is measured at (None: the run's)."""

    name: str
    make_sender: Callable
    asynchronous: bool = False
    sessions: tuple[int, ...] | None = None
    concurrencies: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ServedSystem:
    """A model repository served by one tritonserver, and the client paths measured against it."""

    key: str
    repository: Path
    model: str
    clients: tuple[ClientPath, ...]
    #: the server's backend folder, when not the default (the pytorch backend alone)
    backend_directory: Path | None = None


def project_ensemble(
    workload: Workload,
    backend: str = "python",
    workflow_backend: str = "python",
    compiled: str = "torchscript",
) -> Ensemble:
    """The example's graph: raw clicks in; per session its id and the k best raw item ids not
    yet clicked, with their scores (as in examples/session_based/demo.py). ``backend="pytorch"``
    makes the mixed export: the model, TopK and DecodeItemIds in one libtorch model; with
    ``workflow_backend="pytorch"`` too, the all-libtorch export: the workflow's TorchScript with
    them, one libtorch model from raw clicks to raw item ids. ``compiled="package"`` makes that
    libtorch model an AOTInductor package instead of TorchScript."""
    workflow = workload.workflow
    session_features = workflow.input_schema.column_names >> TransformWorkflow(
        workflow, backend=workflow_backend, compiled=compiled
    )
    recommendations = (
        session_features
        >> PredictPytorch(workload.session_model, backend=backend, compiled=compiled)
        >> TopK(TOP_K, seen_items=session_features["item_id-list"], exclude_ids=list(RESERVED_IDS))
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    return Ensemble(session_features["session_id"] + recommendations, workflow.input_schema)


#: the asyncio client's settings: one session per request, from one coroutine and from 64
ASYNC_SESSIONS, ASYNC_CONCURRENCIES = (1,), (1, 64)


def project_system(
    key: str,
    repository: Path,
    model: str,
    request_schema: Schema,
    backend_directory: Path | None = None,
    *,
    asynchronous: bool = False,
) -> ServedSystem:
    """An export of this project, measured through ``Client`` and through prebuilt tritonclient
    requests (``asynchronous``: and through ``AsyncClient``)."""
    clients = (project_client(model), prebuilt_tritonclient(model, request_schema))
    if asynchronous:
        clients += (async_project_client(model),)
    return ServedSystem(key, repository, model, clients, backend_directory)


def project_client(model: str) -> ClientPath:
    """``merlin_torch_serving.Client.infer``: DataFrame of raw rows in, DataFrame out."""

    def make_sender(url: str, protocol: str, requests: list[pd.DataFrame]) -> Sender:
        client = Client(url, protocol, timeout_s=REQUEST_TIMEOUT_S)
        client.schemas(model)  # fetched once per client, before timing

        def send(index: int) -> None:
            client.infer(model, requests[index % len(requests)])

        return send

    return ClientPath("Client", make_sender)


def async_project_client(model: str) -> ClientPath:
    """``merlin_torch_serving.AsyncClient.infer``, awaited: DataFrame of raw rows in, DataFrame
    out; the coroutines of a setting share one client."""

    async def make_sender(url: str, protocol: str, requests: list[pd.DataFrame]):
        client = AsyncClient(url, protocol, timeout_s=REQUEST_TIMEOUT_S)
        await client.schemas(model)  # fetched once per client, before timing

        async def send(index: int) -> None:
            await client.infer(model, requests[index % len(requests)])

        return send, client.close

    return ClientPath(
        "AsyncClient",
        make_sender,
        asynchronous=True,
        sessions=ASYNC_SESSIONS,
        concurrencies=ASYNC_CONCURRENCIES,
    )


def prebuilt_tritonclient(model: str, request_schema: Schema) -> ClientPath:
    """tritonclient with every request's tensors built before timing: the wire cost alone."""

    def make_sender(url: str, protocol: str, requests: list[pd.DataFrame]) -> Sender:
        module, client, timeout = _tritonclient(protocol, url)
        output_names = _output_names(client, protocol, model)
        prebuilt = []
        for frame in requests:
            arrays = wire.to_wire(frames.frame_to_table(frame, request_schema))
            prebuilt.append([_infer_input(module, name, array) for name, array in arrays.items()])
        outputs = [module.InferRequestedOutput(name) for name in output_names]

        def send(index: int) -> None:
            result = client.infer(
                model, prebuilt[index % len(prebuilt)], outputs=outputs, **timeout
            )
            for name in output_names:
                result.as_numpy(name)

        return send

    return ClientPath("tritonclient, prebuilt", make_sender)


def merlin_tritonclient(model: str, request_schema: Schema, output_names: list[str]) -> ClientPath:
    """What ``merlin.systems.triton.utils.send_triton_request`` does per request (convert the
    DataFrame with Merlin's ``convert_df_to_triton_input``, infer, read the outputs), minus its
    extra is-server-live round trip, and over HTTP too."""

    def make_sender(url: str, protocol: str, requests: list[pd.DataFrame]) -> Sender:
        from merlin.systems.triton import convert_df_to_triton_input

        module, client, timeout = _tritonclient(protocol, url)
        client.is_server_live()  # connects before timing, as the other client paths do

        def send(index: int) -> None:
            frame = requests[index % len(requests)]
            inputs = convert_df_to_triton_input(request_schema, frame, module.InferInput)
            outputs = [module.InferRequestedOutput(name) for name in output_names]
            result = client.infer(model, inputs, outputs=outputs, **timeout)
            for name in output_names:
                result.as_numpy(name)

        return send

    return ClientPath("Merlin convert_df + tritonclient", make_sender)


def _tritonclient(protocol: str, url: str):
    """The tritonclient module, a client of ``url``, and the keyword that bounds each infer call."""
    if protocol == "grpc":
        import tritonclient.grpc as module

        return module, module.InferenceServerClient(url), {"client_timeout": REQUEST_TIMEOUT_S}
    if protocol == "http":
        import tritonclient.http as module

        client = module.InferenceServerClient(
            url, connection_timeout=REQUEST_TIMEOUT_S, network_timeout=REQUEST_TIMEOUT_S
        )
        return module, client, {}
    raise ValueError(f"protocol must be 'grpc' or 'http', got {protocol!r}")


def _output_names(client, protocol: str, model: str) -> list[str]:
    config = (
        client.get_model_config(model, as_json=True)
        if protocol == "grpc"
        else client.get_model_config(model)
    )
    config = config.get("config", config)
    return [output["name"] for output in config["output"]]


def _infer_input(module, name: str, array):
    tensor = module.InferInput(name, list(array.shape), wire.triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor
