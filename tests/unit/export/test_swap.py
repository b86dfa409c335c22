"""Replacing a repository, and cleaning up after a killed export.

A replaced repository's path always holds a whole tree.
"""

import errno
import os

import pytest

from merlin_torch_serving.export import swap


def tree(path, marker):
    (path / "model" / "1").mkdir(parents=True)
    (path / "model" / "config.pbtxt").write_text(marker)
    return path


def marker(path):
    return (path / "model" / "config.pbtxt").read_text()


def test_exchange_trades_two_folders_in_one_step(tmp_path):
    tree(tmp_path / "a", "a")
    tree(tmp_path / "b", "b")
    swap.exchange(tmp_path / "a", tmp_path / "b")
    assert (marker(tmp_path / "a"), marker(tmp_path / "b")) == ("b", "a")


def test_replace_tree_puts_the_staged_tree_in_place_and_leaves_the_old_one_in_staging(tmp_path):
    target = tree(tmp_path / "repository", "old")
    staging = swap.staging_folder(target)
    tree(staging / swap.STAGED_DIR, "new")
    assert staging.name.startswith(f".repository.export-{os.getpid()}-")
    swap.replace_tree(staging, target)
    assert marker(target) == "new"
    assert marker(staging / swap.STAGED_DIR) == "old"


def test_replace_tree_creates_a_missing_target(tmp_path):
    staging = swap.staging_folder(tmp_path / "repository")
    tree(staging / swap.STAGED_DIR, "new")
    swap.replace_tree(staging, tmp_path / "repository")
    assert marker(tmp_path / "repository") == "new"


def test_without_atomic_exchange_two_renames_are_used(tmp_path, monkeypatch):
    def unsupported(first, second):
        raise OSError(errno.EINVAL, "not supported here")

    monkeypatch.setattr(swap, "exchange", unsupported)
    target = tree(tmp_path / "repository", "old")
    staging = swap.staging_folder(target)
    tree(staging / swap.STAGED_DIR, "new")
    swap.replace_tree(staging, target)
    assert marker(target) == "new"
    assert marker(staging / swap.PREVIOUS_DIR) == "old"


def dead_pid():
    """The pid of a process that has ended."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_recover_puts_back_a_tree_left_aside_by_a_killed_export_and_deletes_its_staging(tmp_path):
    staging = tmp_path / f".repository.export-{dead_pid()}-x1"
    tree(staging / swap.PREVIOUS_DIR, "old")  # killed between the two renames of the fallback
    swap.recover(tmp_path / "repository")
    assert marker(tmp_path / "repository") == "old"
    assert not staging.exists()


def test_recover_leaves_the_staging_folders_of_running_exports_alone(tmp_path):
    tree(tmp_path / "repository", "live")
    running = tmp_path / f".repository.export-{os.getpid()}-x2"
    tree(running / swap.STAGED_DIR, "being written")
    stale = tmp_path / f".repository.export-{dead_pid()}-x3"
    tree(stale / swap.STAGED_DIR, "abandoned")
    swap.recover(tmp_path / "repository")
    assert running.exists()
    assert not stale.exists()
    assert marker(tmp_path / "repository") == "live"


def test_exchange_reports_a_missing_folder(tmp_path):
    tree(tmp_path / "a", "a")
    with pytest.raises(OSError, match="RENAME_EXCHANGE"):
        swap.exchange(tmp_path / "a", tmp_path / "missing")
