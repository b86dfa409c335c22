"""Helpers for tests against a served ensemble: exact comparison of answers, ``AsyncClient``
against ``Client``, raw tritonclient requests, and traffic from several threads over both
protocols with every answer checked."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from merlin_torch_serving import AsyncClient, Client
from merlin_torch_serving.data import wire
from merlin_torch_serving.launcher.process import children_of


def assert_frames_equal(served: pd.DataFrame, local: pd.DataFrame):
    """Same columns, same rows, every cell equal to the last bit."""
    assert list(served.columns) == list(local.columns)
    assert len(served) == len(local)
    for column in local.columns:
        for got, want in zip(served[column], local[column], strict=True):
            np.testing.assert_array_equal(got, want, err_msg=column)


def frames_equal(served: pd.DataFrame, local: pd.DataFrame) -> bool:
    try:
        assert_frames_equal(served, local)
    except AssertionError:
        return False
    return True


class AwaitedClient:
    """An ``AsyncClient`` driven from a test's own thread, so that tests written for ``Client``
    run unchanged on it: each method call runs to its end in the client's own event loop."""

    def __init__(self, url: str, protocol: str = "grpc", **options):
        self._loop = asyncio.new_event_loop()
        self._client = AsyncClient(url, protocol, **options)

    def __getattr__(self, name: str):
        method = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(method):
            return method
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._client.close())
        finally:
            self._loop.close()

    def __enter__(self) -> AwaitedClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def assert_async_client_answers_as_client(url: str, protocol: str, model: str, requests) -> None:
    """``AsyncClient.infer`` answers each request (a DataFrame) exactly as ``Client.infer`` does,
    and ``infer_columns`` the same columns."""
    with Client(url, protocol) as client:
        expected = [client.infer(model, rows) for rows in requests]

    async def ask() -> list:
        async with AsyncClient(url, protocol) as client:
            return [
                (await client.infer(model, rows), await client.infer_columns(model, rows))
                for rows in requests
            ]

    for (frame, columns), want in zip(asyncio.run(ask()), expected, strict=True):
        assert_frames_equal(frame, want)
        assert list(columns) == list(want.columns)
        for name, column in columns.items():
            for got_cell, want_cell in zip(column, want[name], strict=True):
                np.testing.assert_array_equal(got_cell, want_cell, err_msg=name)


def concurrent_answers(
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


def batches_formed(url: str, model: str, admin_key: str | None) -> dict[int, int]:
    """Batch size -> how many times ``model`` ran a batch of that many requests (Triton's
    statistics, over HTTP; the statistics API wants the server's admin key)."""
    import tritonclient.http

    from merlin_torch_serving.launcher import access

    client = tritonclient.http.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(model, headers=access.headers(admin_key))[
            "model_stats"
        ][0]
    finally:
        client.close()
    return {
        int(entry["batch_size"]): int(entry["compute_infer"]["count"])
        for entry in stats["batch_stats"]
    }


def requests_answered_once(
    url: str, admin_key: str | None, model: str, count: int, timeout_s: float = 10.0
) -> dict[str, int]:
    """``requests_answered`` once ``model`` has counted ``count`` answered requests (or after
    ``timeout_s``): Triton counts an ensemble's request just after it answers it."""
    deadline = time.monotonic() + timeout_s
    while True:
        answered = requests_answered(url, admin_key)
        if answered.get(model, 0) >= count or time.monotonic() > deadline:
            return answered
        time.sleep(0.05)


def requests_answered(url: str, admin_key: str | None) -> dict[str, int]:
    """Model -> the requests it has answered (Triton's statistics, over HTTP)."""
    import tritonclient.http

    from merlin_torch_serving.launcher import access

    client = tritonclient.http.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(headers=access.headers(admin_key))["model_stats"]
    finally:
        client.close()
    return {entry["name"]: int(entry["inference_stats"]["success"]["count"]) for entry in stats}


def raw_inputs(module, arrays: dict) -> list:
    """tritonclient's (``module``'s) input tensors, one per array exactly as given (no checks, no
    casts)."""
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), wire.triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def raw_infer(module, url: str, model: str, arrays: dict, output_names) -> dict:
    """A raw tritonclient request, one tensor per array exactly as given (no checks, no casts)."""
    client = module.InferenceServerClient(url)
    try:
        outputs = [module.InferRequestedOutput(name) for name in output_names]
        result = client.infer(model, raw_inputs(module, arrays), outputs=outputs)
        return {name: result.as_numpy(name) for name in output_names}
    finally:
        client.close()


def stubs_of(server, model: str) -> list[int]:
    """Pids of the live python-backend stubs that run ``model`` on a running TritonServer."""
    return [
        p.pid
        for p in children_of(server.pid)
        if p.is_alive
        and len(p.argv) > 1
        and p.argv[0].endswith("triton_python_backend_stub")
        and f"/{model}/" in p.argv[1]
    ]


def wait_for_health(server, name: str, predicate, timeout_s: float):
    """The health of model ``name`` once ``predicate`` holds for it, or as it is at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        model = next(m for m in server.health() if m.name == name)
        if predicate(model) or time.monotonic() >= deadline:
            return model
        time.sleep(0.1)


@dataclass
class Traffic:
    """Threads sending ``requests`` (DataFrames) round-robin to ``model`` over gRPC and HTTP
    until stopped, each answer compared with ``expected`` (the in-process answer to the same
    request, or a tuple of the answers it may equal while a setting changes): errors and
    mismatches are counted, with the first few kept for the message."""

    urls: dict  # protocol -> url
    model: str
    requests: list
    expected: list
    threads_per_protocol: int = 2
    answered: Counter = field(default_factory=Counter)
    errors: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, args=(protocol, offset), daemon=True)
            for protocol in self.urls
            for offset in range(self.threads_per_protocol)
        ]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def wait_for(self, answers: int, timeout_s: float = 120.0) -> None:
        """Block until ``answers`` more requests were answered (the traffic really flows)."""
        target = sum(self.answered.values()) + answers
        deadline = time.monotonic() + timeout_s
        while (
            sum(self.answered.values()) < target and time.monotonic() < deadline and not self.errors
        ):
            time.sleep(0.05)

    @property
    def total(self) -> int:
        return sum(self.answered.values()) + len(self.errors)

    def _send(self, protocol: str, offset: int) -> None:
        # no retries: a request that needed one would be a failed request to the caller of the test
        with Client(self.urls[protocol], protocol, retries=0) as client:
            self._send_until_stopped(client, protocol, offset)

    def _send_until_stopped(self, client: Client, protocol: str, offset: int) -> None:
        index = offset
        while not self._stop.is_set():
            request, expected = (
                self.requests[index % len(self.requests)],
                self.expected[index % len(self.expected)],
            )
            index += 1
            try:
                answer = client.infer(self.model, request)
            except Exception as error:  # every failure counts, whatever its kind
                self.errors.append(f"{protocol}: {type(error).__name__}: {error}"[:300])
                continue
            self.answered[protocol] += 1
            alternatives = expected if isinstance(expected, tuple) else (expected,)
            if not any(frames_equal(answer, one) for one in alternatives):
                self.mismatches.append(f"{protocol}: request {index - 1}")
