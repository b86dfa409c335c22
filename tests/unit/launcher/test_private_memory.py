"""What tritonserver is started with so that its python backend's shared memory is its user's
alone, tried on a child process that does what the python backend does (no server needed; the
served regions are checked in tests/integration/test_access.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from merlin_torch_serving.launcher import private_memory

# what boost.interprocess does to make a region: open it 0644, then fchmod it 0644 so that no
# umask narrows it; and a file given another mode by fchmod (an executable, say)
MAKE_FILES = """
import os, sys
folder = sys.argv[1]
region = os.open(os.path.join(folder, "region"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
os.fchmod(region, 0o644)
tool = os.open(os.path.join(folder, "tool"), os.O_RDWR | os.O_CREAT, 0o600)
os.fchmod(tool, 0o755)
"""


def test_a_region_made_as_boost_makes_it_stays_owner_only_and_other_modes_are_set(tmp_path):
    subprocess.run(
        [sys.executable, "-c", MAKE_FILES, str(tmp_path)],
        preexec_fn=private_memory.restrictor(),
        check=True,
    )
    assert stat.S_IMODE(os.stat(tmp_path / "region").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "tool").st_mode) == 0o755


def test_without_it_the_region_is_readable_by_everyone(tmp_path):
    subprocess.run([sys.executable, "-c", MAKE_FILES, str(tmp_path)], check=True)
    assert stat.S_IMODE(os.stat(tmp_path / "region").st_mode) == 0o644


def test_regions_others_may_read_are_found_by_prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(private_memory, "SHARED_MEMORY_DIR", tmp_path)
    for name, mode in (("mts_a_1", 0o600), ("mts_a_2", 0o644), ("other_3", 0o644)):
        (tmp_path / name).touch(mode=mode)
        os.chmod(tmp_path / name, mode)
    assert private_memory.exposed_regions("mts_a_") == [tmp_path / "mts_a_2"]
