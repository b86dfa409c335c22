"""Putting a staged model repository in place of the live one so that, at every instant, the path
holds either the whole old tree or the whole new tree, even if the process dies half-way.

On Linux the two trees trade places in one ``renameat2(RENAME_EXCHANGE)`` call; the old tree is
then deleted from the staging folder. A served repository therefore never shows a tritonserver
(polling it, or loading a model from it) a half-written model. Where the filesystem cannot
exchange (some network and overlay filesystems), two renames are used, and a staging folder left by
a process that died between them is put back by the next export to that path.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger("merlin_torch_serving")

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # from <linux/fs.h>
_NOT_SUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)
#: inside a staging folder: the tree being built, and (two-rename fallback only) the old tree
STAGED_DIR = "repository"
PREVIOUS_DIR = "previous"


def staging_folder(target: Path) -> Path:
    """A new, hidden staging folder beside ``target``, named after this process so that the
    staging folders of processes that died can be told apart from those of running ones."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.export-{os.getpid()}-", dir=target.parent))


def replace_tree(staging: Path, target: Path) -> None:
    """Put ``staging/repository`` at ``target``; the old tree, if any, is left in ``staging``."""
    staged = staging / STAGED_DIR
    if not target.exists():
        os.rename(staged, target)
        return
    try:
        exchange(staged, target)
    except OSError as error:
        if error.errno not in _NOT_SUPPORTED:
            raise
        _warn_once(target.parent)
        previous = staging / PREVIOUS_DIR
        os.rename(target, previous)
        try:
            os.rename(staged, target)
        except BaseException:
            os.rename(previous, target)
            raise


def exchange(first: Path, second: Path) -> None:
    """Swap two paths in one atomic step (Linux ``renameat2`` with ``RENAME_EXCHANGE``)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if (
        renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
        != 0
    ):
        code = ctypes.get_errno()
        raise OSError(
            code,
            f"renameat2({str(first)!r}, {str(second)!r}, RENAME_EXCHANGE): {os.strerror(code)}",
        )


def recover(target: Path) -> None:
    """Clean up after exports to ``target`` whose process died: put an old tree back where the
    path was left empty between two renames, and delete their staging folders."""
    for staging in target.parent.glob(f".{target.name}.export-*-*"):
        pid = staging.name[len(f".{target.name}.export-") :].split("-", 1)[0]
        if not pid.isdigit() or _is_running(int(pid)):
            continue
        previous = staging / PREVIOUS_DIR
        if previous.is_dir() and not target.exists():
            os.rename(previous, target)
            logger.warning(
                "put back the repository %s left aside by an export that did not finish", target
            )
        shutil.rmtree(staging, ignore_errors=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.lru_cache(maxsize=1)
def _renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    function.restype = ctypes.c_int
    return function


@functools.cache
def _warn_once(folder: Path) -> None:
    logger.warning(
        "the filesystem of %s cannot exchange two folders atomically; the repository is replaced by"
        " two renames, so a process killed between them leaves it aside until the next export",
        folder,
    )
