"""What the nvidia-pytriton wheel provides and where the cache lives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from merlin_torch_serving.backends import bundle


def test_the_bundled_tritonserver_reports_its_version():
    assert re.fullmatch(r"2\.\d+\.\d+", bundle.tritonserver_version(bundle.bundled_tritonserver()))


def test_a_binary_that_prints_no_version_has_none(tmp_path):
    silent = tmp_path / "tritonserver"
    silent.write_text("#!/bin/sh\necho 'error: creating server'\nexit 1\n")
    silent.chmod(0o755)
    assert bundle.tritonserver_version(silent) is None
    assert bundle.tritonserver_version(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.41.0", "r23.12"), ("2.51.0", "r24.10"), ("2.53.1", "r24.12"), ("2.54.0", "r25.01")],
)
def test_release_branches_follow_the_monthly_numbering(version, release):
    assert bundle.release_of(version) == release


def test_a_version_before_the_monthly_numbering_has_no_known_release():
    with pytest.raises(
        ValueError,
        match=r"no release branch known for tritonserver 2\.40\.0 \(2\.41 and newer are\)",
    ):
        bundle.release_of("2.40.0")


def test_the_wheel_s_renamed_libtritonserver_is_found():
    library = bundle.libtritonserver()
    assert library.parent == bundle.pytriton_libraries()
    assert library.name.startswith("libtritonserver")
    assert library.is_file()


def test_cache_root_is_mts_cache_dir_else_under_xdg_cache_home_else_under_home(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("MTS_CACHE_DIR", str(tmp_path / "chosen"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundle.cache_root() == tmp_path / "chosen"
    monkeypatch.delenv("MTS_CACHE_DIR")
    assert bundle.cache_root() == tmp_path / "xdg" / "merlin_torch_serving"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert bundle.cache_root() == Path.home() / ".cache" / "merlin_torch_serving"
