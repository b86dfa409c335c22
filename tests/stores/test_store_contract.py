"""What every store promises (``stores.base``), checked on the embedded store and on Redis."""

from __future__ import annotations

import threading
import time

from merlin_torch_serving.stores import Click, TrendingWindow


def click(n: int, timestamp: float | None = None, item: str | None = None, bucket: int = 0):
    return Click(
        f"key{n}".encode(), float(n if timestamp is None else timestamp), b"row%d" % n, item, bucket
    )


def test_append_returns_the_last_clicks_in_timestamp_order(store):
    stored = store.append(
        {"s1": [click(3), click(1), click(2)], "s2": [click(9)]}, keep=10, ttl_s=600
    )
    assert stored == {"s1": [b"row1", b"row2", b"row3"], "s2": [b"row9"]}
    assert store.append({"s1": [click(4), click(5)]}, keep=3, ttl_s=600) == {
        "s1": [b"row3", b"row4", b"row5"]
    }
    assert store.clicks("s1", keep=2) == [b"row4", b"row5"]


def test_a_click_sent_again_is_stored_once(store):
    store.append({"s": [click(1), click(2)]}, keep=10, ttl_s=600)
    again = store.append({"s": [click(2), click(1), click(2), click(3)]}, keep=10, ttl_s=600)
    assert again == {"s": [b"row1", b"row2", b"row3"]}


def test_equal_timestamps_keep_the_order_the_clicks_arrived_in(store):
    store.append({"s": [click(7, timestamp=5.0)]}, keep=10, ttl_s=600)
    store.append({"s": [click(2, timestamp=5.0), click(1, timestamp=1.0)]}, keep=10, ttl_s=600)
    assert store.clicks("s") == [b"row1", b"row7", b"row2"]


def test_eight_threads_appending_to_the_same_sessions_lose_no_click(store):
    sessions = [f"s{i}" for i in range(4)]
    start = threading.Barrier(8)
    errors = []

    def send(thread: int) -> None:
        start.wait()
        for n in range(25):
            number = thread * 100 + n
            try:
                store.append(
                    {sessions[number % 4]: [click(number), click(number)]}, keep=1000, ttl_s=600
                )
            except Exception as error:
                errors.append(error)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    for index, session in enumerate(sessions):
        numbers = sorted(
            t * 100 + n for t in range(8) for n in range(25) if (t * 100 + n) % 4 == index
        )
        assert store.clicks(session) == [b"row%d" % n for n in numbers]


def test_forget_removes_a_session_and_only_it(store):
    store.append({"gone": [click(1)], "kept": [click(2)]}, keep=10, ttl_s=600)
    assert store.count_sessions() == 2
    assert store.forget("gone") is True
    assert store.count_sessions() == 1
    assert store.forget("gone") is False
    assert store.clicks("gone") == []
    assert store.clicks("kept") == [b"row2"]
    # a click of a forgotten session is new again
    assert store.append({"gone": [click(1)]}, keep=10, ttl_s=600) == {"gone": [b"row1"]}


def test_a_session_expires_its_ttl_after_its_last_click(store):
    store.append({"short": [click(1)]}, keep=10, ttl_s=0.5)
    store.append({"long": [click(2)]}, keep=10, ttl_s=3600)
    deadline = time.monotonic() + 30
    while store.clicks("short") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert store.clicks("short") == []
    assert store.clicks("long") == [b"row2"]
    # an expired session starts afresh, its old clicks gone with it
    assert store.append({"short": [click(3)]}, keep=10, ttl_s=600) == {"short": [b"row3"]}


def test_block_lists_change_item_by_item(store):
    assert store.block("stock", ["12", "7", "12"]) == 2
    assert store.block("market", ["1"]) == 1
    assert store.blocked("stock") == ["12", "7"]
    assert store.unblock("stock", ["7", "99"]) == 1
    assert store.blocked("stock") == ["12"]
    assert store.rule_lists() == ["market", "stock"]
    store.replace_blocked("stock", ["3", "4"])
    assert store.blocked("stock") == ["3", "4"]
    assert store.blocked("never") == []


def test_trending_counts_only_new_clicks_and_keep_the_window(store):
    trend = TrendingWindow("t", window=2)
    store.append(
        {"a": [click(1, item="x", bucket=10), click(2, item="y", bucket=10)]},
        keep=10,
        ttl_s=600,
        trending=trend,
    )
    store.append(
        {"b": [click(1, item="x", bucket=11)], "a": [click(1, item="x", bucket=10)]},
        keep=10,
        ttl_s=600,
        trending=trend,
    )
    counts = store.trending_counts("t", window=2)
    assert counts.latest == 11
    assert counts.buckets == {10: {"x": 1, "y": 1}, 11: {"x": 1}}
    store.append({"c": [click(5, item="z", bucket=12)]}, keep=10, ttl_s=600, trending=trend)
    assert store.trending_counts("t", window=2).buckets == {11: {"x": 1}, 12: {"z": 1}}
    assert store.trending_counts("other", window=2).latest is None


def test_clicks_without_an_item_are_not_counted(store):
    trend = TrendingWindow("quiet", window=5)
    store.append({"a": [click(1)]}, keep=10, ttl_s=600, trending=trend)
    assert store.trending_counts("quiet", window=5).latest is None
