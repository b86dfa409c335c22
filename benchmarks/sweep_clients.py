"""Closed-loop clients in processes of their own, for the concurrency sweep.

Client threads in the benchmark's own process would share one interpreter lock with each other
and with the code that measures: at 32 or 64 clients that lock, not the server, would set the
pace. So the clients run in a few processes (one per core), each with its share of the clients as
threads. On a 2-core machine every microsecond a client spends is taken from the server, so a
client works as Triton's perf_analyzer does: each request is serialized once, before the clock
starts (a gRPC ``ModelInferRequest``, or the body of an HTTP request in the binary tensor
extension), sent as bytes, and its answer is read as bytes and checked for success, not decoded
(tritonclient's ``infer`` costs about 0.5 ms of client CPU a request here, which is more than a
batched step spends on it). Only numpy, grpc and tritonclient are imported here, so a process
starts in a moment. The answers themselves are checked in tests/integration/test_batching.py.
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass

import numpy as np

#: a gRPC method called with bytes in and bytes out: no protobuf work in the timed loop
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_SERVER_READY = "/inference.GRPCInferenceService/ServerReady"
_MAX_MESSAGE = 256 * 1024 * 1024


@dataclass(frozen=True)
class ClientJob:
    """What one client process does: ``clients`` threads (numbers ``first_client`` on, of
    ``all_clients``) sending ``requests`` (wire arrays) to ``model`` from ``start_at`` (wall
    clock, warm-up before) to ``stop_at``; client number c sends requests c, c + all_clients, ...
    in turn, so that no two clients send the same request (session) when there are enough."""

    url: str
    protocol: str
    model: str
    requests: list  # of dict name -> array, in the form the model takes
    outputs: list[str]
    clients: int
    first_client: int
    all_clients: int
    start_at: float
    stop_at: float


def run_clients(job: ClientJob) -> tuple[list[float], int]:
    """(latencies in ms of the requests sent and answered inside the window, failures)."""
    latencies: list[list[float]] = [[] for _ in range(job.clients)]
    failures = [0] * job.clients
    threads = [
        threading.Thread(target=_client, args=(job, i, latencies[i], failures))
        for i in range(job.clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [ms for own in latencies for ms in own], sum(failures)


def _client(job: ClientJob, index: int, latencies: list[float], failures: list[int]) -> None:
    number = job.first_client + index
    own = job.requests[number % len(job.requests) :: job.all_clients] or job.requests
    send, close = (grpc_sender if job.protocol == "grpc" else http_sender)(
        job.url, job.model, own, job.outputs
    )
    turn = 0
    try:
        while True:
            began = time.time()
            if began >= job.stop_at:
                return
            if not send(turn % len(own)):
                failures[index] += 1
                continue
            answered = time.time()
            turn += 1
            if began >= job.start_at and answered <= job.stop_at:
                latencies.append((answered - began) * 1000.0)
    finally:
        close()


@dataclass(frozen=True)
class AlternatingJob:
    """One client sending to several ``models`` (each with its requests, in the form it takes)
    in turn, one request at a time, for ``rounds`` rounds after ``warmup_rounds``: in a round
    every model gets the same request (by position), and the order rotates from round to round.
    Models measured so meet the same machine, request by request, not window by window."""

    url: str
    protocol: str
    models: list  # of (model name, its requests)
    outputs: list[str]
    rounds: int
    warmup_rounds: int


def run_alternating(job: AlternatingJob) -> dict[str, list[float]]:
    """Per model, the latencies in ms of its measured requests."""
    connect = grpc_sender if job.protocol == "grpc" else http_sender
    senders = {
        model: connect(job.url, model, requests, job.outputs) for model, requests in job.models
    }
    count = min(len(requests) for _, requests in job.models)
    order = [model for model, _ in job.models]
    latencies: dict[str, list[float]] = {model: [] for model in order}
    try:
        for turn in range(job.warmup_rounds + job.rounds):
            shift = turn % len(order)
            for model in order[shift:] + order[:shift]:
                send, _ = senders[model]
                began = time.perf_counter()
                if not send(turn % count):
                    raise RuntimeError(f"{model}: request {turn % count} failed")
                if turn >= job.warmup_rounds:
                    latencies[model].append((time.perf_counter() - began) * 1000.0)
    finally:
        for _, close in senders.values():
            close()
    return latencies


def grpc_sender(url: str, model: str, requests: list, outputs: list[str]):
    """(send(i) -> answered, close) for ``requests`` to ``model`` over a gRPC channel of their
    own, connected before it returns (a readiness call)."""
    import grpc
    from tritonclient.grpc import service_pb2

    payloads = []
    for arrays in requests:
        request = service_pb2.ModelInferRequest(model_name=model)
        for name, array in arrays.items():
            tensor = request.inputs.add()
            tensor.name, tensor.datatype = name, _triton_dtype(array)
            tensor.shape.extend(array.shape)
            request.raw_input_contents.append(_raw(array))
        for name in outputs:
            request.outputs.add().name = name
        payloads.append(request.SerializeToString())
    channel = grpc.insecure_channel(
        url,
        options=[
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ],
    )
    infer = channel.unary_unary(_MODEL_INFER)  # no serializers: bytes in, bytes out
    channel.unary_unary(_SERVER_READY)(
        service_pb2.ServerReadyRequest().SerializeToString(), timeout=120.0
    )

    def send(i: int) -> bool:
        try:
            infer(payloads[i], timeout=120.0)
        except grpc.RpcError:
            return False
        return True

    return send, channel.close


def http_sender(url: str, model: str, requests: list, outputs: list[str]):
    """(send(i) -> answered, close) for ``requests`` to ``model`` over an HTTP connection of
    their own."""
    import tritonclient.http as httpclient

    prepared = []
    for arrays in requests:
        inputs = []
        for name, array in arrays.items():
            tensor = httpclient.InferInput(name, list(array.shape), _triton_dtype(array))
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        wanted = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            inputs, outputs=wanted
        )
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        prepared.append((body, headers))
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=120.0)
    path = f"/v2/models/{model}/infer"

    def send(i: int) -> bool:
        body, headers = prepared[i]
        try:
            connection.request("POST", path, body, headers)
            response = connection.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):
            connection.close()  # reconnects on the next request
            return False
        return response.status == 200

    return send, connection.close


def _raw(array: np.ndarray) -> bytes:
    if array.dtype == np.dtype(object):
        from tritonclient.utils import serialize_byte_tensor

        return serialize_byte_tensor(array).tobytes()
    return np.ascontiguousarray(array).tobytes()


def _triton_dtype(array: np.ndarray) -> str:
    if array.dtype == np.dtype(object):
        return "BYTES"
    return {
        "int64": "INT64",
        "int32": "INT32",
        "float32": "FP32",
        "float64": "FP64",
        "bool": "BOOL",
    }[array.dtype.name]
