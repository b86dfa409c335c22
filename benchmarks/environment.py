"""The machine a run measured: what it is (CPU, versions, date), and how much CPU the rest of the
machine took while each measurement ran, so contaminated numbers can be told apart.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import psutil

# Other processes (or other virtual machines) taking this much CPU (in cores) during a measurement
# make it suspect: on 2 cores, torch's intra-op threads then wait for each other for whole
# scheduler time slices.
BUSY_MACHINE_CORES = 0.25

PACKAGES = (
    "merlin-torch-serving",
    "merlin-core",
    "merlin-systems",
    "nvtabular",
    "transformers4rec",
    "torch",
    "tritonclient",
    "nvidia-pytriton",
    "numpy",
    "pandas",
)


def describe_machine(repository_root: Path) -> dict:
    """Date, CPU, memory, Python, package versions and the commit measured."""
    import torch

    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch_threads": torch.get_num_threads(),
        "packages": {name: _version(name) for name in PACKAGES},
        "commit": _git(repository_root, "rev-parse", "--short", "HEAD"),
        # results of an earlier run are not code; any other change means the commit is not what ran
        "uncommitted_changes": bool(
            _git(
                repository_root,
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!benchmarks/results",
            )
        ),
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
    }


class OtherCpuLoad:
    """CPU taken from the processes under test while the ``with`` block ran, in cores.

    ``own_pids`` lists the processes under test besides this one (the server and its stubs).
    ``other_cores`` counts everything else busy on the machine (another test run, a build) plus
    the time the hypervisor gave to other virtual machines (steal), which slows a run just as
    much; ``steal_cores`` is that last part on its own.
    """

    def __init__(self, own_pids: Callable[[], list[int]] = list):
        self.own_pids = own_pids
        self.other_cores = 0.0
        self.steal_cores = 0.0

    def __enter__(self) -> OtherCpuLoad:
        self._began = time.perf_counter()
        self._machine = psutil.cpu_times()
        self._own = self._own_cpu_s()
        return self

    def __exit__(self, *exc_info) -> None:
        wall = max(time.perf_counter() - self._began, 1e-9)
        machine = psutil.cpu_times()
        busy = _busy_s(machine) - _busy_s(self._machine)
        own = self._own_cpu_s() - self._own
        self.steal_cores = max(
            0.0, (getattr(machine, "steal", 0.0) - getattr(self._machine, "steal", 0.0)) / wall
        )
        self.other_cores = max(0.0, (busy - own) / wall) + self.steal_cores

    def _own_cpu_s(self) -> float:
        return cpu_seconds([os.getpid(), *self.own_pids()])


def cpu_seconds(pids) -> float:
    """User and system CPU the processes ``pids`` have used so far; ended ones count nothing."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _busy_s(times) -> float:
    idle = times.idle + getattr(times, "iowait", 0.0) + getattr(times, "steal", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _git(root: Path, *args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
