"""What makes a server give memory back: malloc thresholds in its environment, no gRPC objects
kept with the largest tensors they carried, and heap trimming in stubs after big requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from merlin_torch_serving.export import heap
from merlin_torch_serving.launcher.config import Ports, ServerConfig
from merlin_torch_serving.launcher.locate import allocator_environment, server_environment


def test_the_server_starts_with_fixed_malloc_thresholds():
    tunables = allocator_environment({"PATH": "/bin"})["GLIBC_TUNABLES"]
    assert tunables == "glibc.malloc.mmap_threshold=1048576:glibc.malloc.trim_threshold=8388608"
    assert "GLIBC_TUNABLES" in server_environment()


def test_other_glibc_tunables_are_kept():
    environment = allocator_environment({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert environment["GLIBC_TUNABLES"].startswith("glibc.cpu.hwcaps=-AVX2:glibc.malloc.")


def test_a_callers_own_malloc_settings_win():
    for environment in (
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
    ):
        assert allocator_environment(environment) == environment


def test_grpc_objects_are_not_kept_for_reuse(tmp_path):
    command = ServerConfig(tmp_path).command(
        Path("/bin/tritonserver"), Path("/backends"), Ports(1, 2, 3), None
    )
    assert "--grpc-infer-allocation-pool-size=0" in command


def test_the_rows_of_a_batch_are_each_requests_longest_tensor_summed():
    requests = [
        {"session_id": np.zeros(3), "item_id-list__values": np.zeros(10)},
        {"session_id": np.zeros(2), "scalar": np.array(1)},
    ]
    assert heap.rows(requests) == 12


def test_only_big_requests_are_followed_by_a_trim():
    assert heap.release_after(heap.TRIM_AFTER_ROWS - 1) is False
    assert heap.release_after(heap.TRIM_AFTER_ROWS) is True  # glibc's malloc_trim ran
