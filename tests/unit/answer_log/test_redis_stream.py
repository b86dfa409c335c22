"""The Redis stream: answers logged as entries and read back exactly (over TLS too), a retried
flush added once, and Redis stopped mid-run: answers go on, drops are counted, health says so,
and what was queued is written once it is back. A real redis-server, never a fake."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from merlin_torch_serving import RedisSettings, RedisStream, read_answers
from merlin_torch_serving.answer_log import records
from merlin_torch_serving.answer_log.redis_sink import StreamSink
from merlin_torch_serving.client.health import SERVICES_PARAMETER, service_health
from tests.answer_logs import (
    answered_sessions,
    assert_logged_once,
    logged_routed,
    made_up_answers,
    rows,
    wait_until,
)
from tests.redis_fixtures import fresh_redis_server, unique_prefix


def test_answers_logged_to_a_stream_over_tls_read_back_as_they_were_answered(
    redis_server, toy_workflow, toy_model
):
    settings = RedisSettings(
        redis_server.tls_url,
        ca_file=str(redis_server.tls_files.ca_file),
        key_prefix=unique_prefix("log"),
        timeout_s=5.0,
    )
    stream = RedisStream(settings)
    ensemble, log = logged_routed(toy_workflow, toy_model, stream, flush_interval_s=0.05)
    answers = [ensemble.transform(rows(n, seed=n, first=1000 * n)) for n in (1, 7)]
    assert log.flush(timeout_s=30)
    logged = read_answers(stream)

    ids = logged.groupby("session_id")["request_id"].first()
    expected = pd.concat([answered_sessions(a, ids[a["session_id"].iloc[0]]) for a in answers])
    assert_logged_once(logged, expected)
    assert logged["session_id"].dtype == np.int64
    assert logged["answered_at"].is_monotonic_increasing


def test_a_flush_retried_after_its_reply_was_lost_is_added_once(redis_server):
    stream = RedisStream(redis_server.url, stream=f"{unique_prefix()}:answers")
    sink = StreamSink(stream)
    table = records.to_table([made_up_answers(7, sessions=2)])
    sink.write(table, 1)
    sink.write(table, 1)  # the same flush again: Redis had added it, the reply never came
    sink.write(table, 2)
    sink.close()
    assert read_answers(stream)["session_id"].tolist() == [7, 8, 7, 8]


def test_redis_stopped_answers_go_on_drops_are_counted_health_says_so_and_writing_resumes(
    tmp_path, toy_workflow, toy_model
):
    with fresh_redis_server(tmp_path / "redis") as server:
        stream = RedisStream(RedisSettings(server.url, timeout_s=0.5, connect_timeout_s=0.5))
        ensemble, log = logged_routed(
            toy_workflow, toy_model, stream, flush_interval_s=0.05, max_pending=30
        )
        request = rows(10, seed=4)
        ensemble.transform(request)
        assert log.flush(timeout_s=30)
        services = service_health({"parameters": _services(log)})
        assert [s.reachable for s in services] == [True]

        server.stop()
        answered = [ensemble.transform(request) for _ in range(6)]  # 60 sessions, 30 fit the queue
        wait_until(lambda: log.status().failing)
        assert all(len(answer) == 10 for answer in answered)
        assert log.status().dropped == 30
        assert "Connection" in log.status().error
        (service,) = service_health({"parameters": _services(log)})
        assert not service.reachable
        assert service.name == "answer log"

        server.start()
        assert log.flush(timeout_s=30)
        assert not log.status().failing
        log.close()
        assert len(read_answers(stream)) == 10 + 30


def _services(log) -> dict:
    """A step config's parameters naming the log's services, as the export writes them."""
    return {SERVICES_PARAMETER: {"string_value": json.dumps(log.services())}}
