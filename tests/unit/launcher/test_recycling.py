"""When a python model is reloaded to give memory back."""

from __future__ import annotations

import pytest

from merlin_torch_serving.launcher import recycling

MB = 2**20
STUBS = frozenset({11, 12})
IDLE = 100  # CPU ticks that do not change between looks


def test_a_model_is_reloaded_once_its_stubs_grew_past_the_limit_and_32_mb():
    watch = recycling.MemoryWatch(0.10)
    assert watch.observe("m", STUBS, 500 * MB, IDLE, now=0.0) is None  # baseline
    assert watch.observe("m", STUBS, 540 * MB, IDLE, now=1.0) is None  # +8 %
    reason = watch.observe("m", STUBS, 560 * MB, IDLE, now=2.0)
    assert reason == "its stubs hold 560 MB against 500 MB since they started (+12%) and are idle"


def test_small_models_need_32_mb_of_growth():
    watch = recycling.MemoryWatch(0.10)
    watch.observe("m", STUBS, 100 * MB, IDLE, now=0.0)
    assert watch.observe("m", STUBS, 130 * MB, IDLE, now=1.0) is None
    assert watch.observe("m", STUBS, 133 * MB, IDLE, now=2.0) is not None


def test_the_baseline_is_the_least_the_stubs_held():
    watch = recycling.MemoryWatch(0.10)
    watch.observe("m", STUBS, 700 * MB, IDLE, now=0.0)  # first seen in the middle of a big request
    watch.observe("m", STUBS, 500 * MB, IDLE, now=1.0)
    assert watch.observe("m", STUBS, 560 * MB, IDLE, now=2.0) is not None


def test_new_stubs_start_a_new_baseline():
    watch = recycling.MemoryWatch(0.10)
    watch.observe("m", STUBS, 500 * MB, IDLE, now=0.0)
    assert watch.observe("m", frozenset({21, 22}), 900 * MB, IDLE, now=1.0) is None
    assert watch.observe("m", frozenset({21, 22}), 910 * MB, IDLE, now=2.0) is None


def test_a_model_that_grows_back_soon_is_reloaded_less_and_less_often():
    watch = recycling.MemoryWatch(0.10)
    watch.observe("m", STUBS, 500 * MB, IDLE, now=0.0)
    watch.reloaded("m", now=0.0)
    fresh = frozenset({31})
    watch.observe("m", fresh, 500 * MB, IDLE, now=1.0)
    assert (
        watch.observe("m", fresh, 600 * MB, IDLE, now=10.0) is None
    )  # within the first wait (30 s)
    assert watch.observe("m", fresh, 600 * MB, IDLE, now=31.0) is not None
    watch.reloaded("m", now=31.0)  # soon after the last: the wait doubles
    again = frozenset({41})
    watch.observe("m", again, 500 * MB, IDLE, now=32.0)
    assert watch.observe("m", again, 600 * MB, IDLE, now=80.0) is None
    assert watch.observe("m", again, 600 * MB, IDLE, now=92.0) is not None


def test_the_limit_must_be_a_positive_fraction():
    with pytest.raises(ValueError, match="growth_limit must be a positive fraction, got 0"):
        recycling.MemoryWatch(0)


def test_resident_bytes_reads_proc():
    import os

    assert recycling.resident_bytes(os.getpid()) > 10 * MB
    assert recycling.resident_bytes(2**22 + 7) == 0


def test_a_model_in_the_middle_of_a_request_is_left_alone():
    watch = recycling.MemoryWatch(0.10)
    watch.observe("m", STUBS, 500 * MB, 100, now=0.0)
    assert watch.observe("m", STUBS, 900 * MB, 150, now=1.0) is None  # working
    assert watch.observe("m", STUBS, 560 * MB, 160, now=2.0) is None  # still working
    assert watch.observe("m", STUBS, 560 * MB, 160, now=3.0) is not None  # idle, kept 60 MB


def test_cpu_ticks_reads_proc():
    import os

    assert recycling.cpu_ticks(os.getpid()) > 0
    assert recycling.cpu_ticks(2**22 + 7) == 0
