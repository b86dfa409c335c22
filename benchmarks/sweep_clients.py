"""Closed-loop clients in processes of their own, for the concurrency sweep.

Client threads in the benchmark's own process would share one interpreter lock with each other
and with the code that measures: at 32 or 64 clients that lock, not the server, would set the
pace. So the clients run in a few processes (one per core), each with its share of the clients as
threads; each client sends prebuilt tensors (raw tritonclient: no DataFrame work, so the client
CPU stays small) and waits for the answer before sending the next. Only numpy and tritonclient are
imported here, so a process starts in a moment.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClientJob:
    """What one client process does: ``clients`` threads sending ``requests`` (wire arrays) in
    turn to ``model`` from ``start_at`` (wall clock, warm-up before) to ``stop_at``."""

    url: str
    protocol: str
    model: str
    requests: list  # of dict name -> array, in the form the model takes
    outputs: list[str]
    clients: int
    first_client: int
    start_at: float
    stop_at: float


def run_clients(job: ClientJob) -> tuple[list[float], int]:
    """(latencies in ms of the requests sent and answered inside the window, failures)."""
    latencies: list[list[float]] = [[] for _ in range(job.clients)]
    failures = [0] * job.clients
    threads = [threading.Thread(target=_client, args=(job, i, latencies[i], failures)) for i in range(job.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [ms for own in latencies for ms in own], sum(failures)


def _client(job: ClientJob, index: int, latencies: list[float], failures: list[int]) -> None:
    if job.protocol == "grpc":
        import tritonclient.grpc as module

        client = module.InferenceServerClient(job.url)
    else:
        import tritonclient.http as module

        client = module.InferenceServerClient(job.url, network_timeout=120.0)
    prepared = []
    for arrays in job.requests:
        inputs = []
        for name, array in arrays.items():
            tensor = module.InferInput(name, list(array.shape), _triton_dtype(array))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        prepared.append(inputs)
    outputs = [module.InferRequestedOutput(name) for name in job.outputs]
    turn = job.first_client + index  # clients start at different requests
    try:
        while True:
            began = time.time()
            if began >= job.stop_at:
                return
            try:
                client.infer(job.model, prepared[turn % len(prepared)], outputs=outputs)
            except Exception:  # noqa: BLE001 - counted; the sweep reports failures
                failures[index] += 1
                continue
            answered = time.time()
            turn += 1
            if began >= job.start_at and answered <= job.stop_at:
                latencies.append((answered - began) * 1000.0)
    finally:
        client.close()


def _triton_dtype(array: np.ndarray) -> str:
    if array.dtype == np.dtype(object):
        return "BYTES"
    return {"int64": "INT64", "int32": "INT32", "float32": "FP32", "float64": "FP64", "bool": "BOOL"}[array.dtype.name]
