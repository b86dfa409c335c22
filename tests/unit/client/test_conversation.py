"""The client's conversation, carried out by the blocking driver (``Client``'s) and the awaiting
one (``AsyncClient``'s): the same retries, the same errors, and a cancelled caller stops it; both
clients hold their settings in it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from merlin_torch_serving import AsyncClient, Client, RequestTimeoutError, ServerUnavailableError
from merlin_torch_serving.client import conversation
from merlin_torch_serving.client.transport import RetryPolicy


def talk(retries: int = 3, backoff_s: float = 0.1) -> conversation.Conversation:
    return conversation.Conversation(
        "host:1",
        "grpc",
        timeout_s=1.0,
        max_rows_per_request=None,
        retries=retries,
        retry_backoff_s=backoff_s,
        admin_key="key",
    )


def test_retryable_errors_are_tried_again_with_growing_waits(monkeypatch):
    waits, attempts = [], []
    monkeypatch.setattr(conversation.time, "sleep", waits.append)

    def refuse(method, *args, **kwargs):
        attempts.append(method)
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(
        ServerUnavailableError, match="host:1 is not available: ConnectionRefusedError"
    ):
        conversation.run(talk().call(None, "get_model_repository_index"), refuse)
    assert attempts == ["get_model_repository_index"] * 4
    assert len(waits) == 3
    assert 0.05 <= waits[0] <= 0.15
    assert 0.2 <= waits[2] <= 0.6


def test_errors_that_are_not_safe_to_retry_are_raised_at_once(monkeypatch):
    monkeypatch.setattr(
        conversation.time, "sleep", lambda seconds: pytest.fail("slept before raising")
    )

    def time_out(method, *args, **kwargs):
        raise TimeoutError("timed out")

    with pytest.raises(RequestTimeoutError, match="'reco' failed: no answer within timeout_s=1"):
        conversation.run(talk().call("reco", "infer", "reco", []), time_out)


def test_the_awaiting_driver_retries_and_maps_errors_as_the_blocking_one():
    attempts = []

    async def refuse(method, *args, **kwargs):
        attempts.append(method)
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(
        ServerUnavailableError, match="host:1 is not available: ConnectionRefusedError"
    ):
        asyncio.run(
            conversation.run_async(talk(backoff_s=0.001).call(None, "is_server_ready"), refuse)
        )
    assert attempts == ["is_server_ready"] * 4


def test_the_awaiting_driver_runs_blocking_steps_off_the_event_loop():
    def steps():
        return (yield conversation.Blocking(threading.get_ident))

    async def main():
        return threading.get_ident(), await conversation.run_async(steps(), None)

    loop_thread, blocking_thread = asyncio.run(main())
    assert loop_thread != blocking_thread


def test_a_cancelled_caller_stops_the_steps_where_they_wait():
    stopped, sent = [], []

    def steps():
        try:
            for part in range(3):
                sent.append(part)
                yield conversation.Call("infer", (part,), {})
        finally:
            stopped.append(True)

    async def never_answers(method, *args, **kwargs):
        await asyncio.sleep(3600)

    async def main():
        task = asyncio.create_task(conversation.run_async(steps(), never_answers))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sent == [0]
    assert stopped == [True]


@pytest.mark.parametrize("kind", ["Client", "AsyncClient"])
def test_both_clients_report_the_settings_they_were_made_with(kind):
    made = Client if kind == "Client" else AsyncClient
    client = made(
        "127.0.0.1:1",
        "http",
        timeout_s=2.5,
        max_rows_per_request=10,
        retries=1,
        retry_backoff_s=0.5,
    )
    try:
        assert (client.url, client.protocol, client.timeout_s) == ("127.0.0.1:1", "http", 2.5)
        assert client.max_rows_per_request == 10
        assert client.retry_policy == RetryPolicy(retries=1, backoff_s=0.5)
    finally:
        if isinstance(client, AsyncClient):
            asyncio.run(client.close())
        else:
            client.close()
