"""The project's change to Triton's pytorch backend, and applying it to the release sources.

The change (``patches/libtorch-aoti-packages.patch``, a unified diff of ``src/libtorch.cc``; its
header says what it does) lets the backend serve AOTInductor packages (``.pt2``) beside
TorchScript. Every build applies it to a copy of the sources, never to the sources given, and the
build cache is keyed by its content (``change_id``), so a build made without it, or with another
version of it, is never taken for one made with it.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from merlin_torch_serving.exceptions import BackendBuildError

PATCH_FILE = Path(__file__).parent / "patches" / "libtorch-aoti-packages.patch"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Hunk:
    """Lines ``old`` of a file, from line ``start`` (1-based), become lines ``new``."""

    start: int
    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the folder holding the five source folders
    hunks: tuple[Hunk, ...]


@functools.cache
def change_id() -> str:
    """The change's identity in the build cache: the start of its patch file's SHA-256."""
    return hashlib.sha256(PATCH_FILE.read_bytes()).hexdigest()[:12]


def changed_backend(source_root: Path, destination: Path) -> Path:
    """A copy of ``source_root/pytorch_backend`` in ``destination`` with the change applied.

    Sources that are not the release the change was made for (their lines differ where it applies)
    raise ``BackendBuildError`` naming the file and the place.
    """
    target = destination / "pytorch_backend"
    shutil.copytree(source_root / "pytorch_backend", target, symlinks=True)
    for change in parse(PATCH_FILE.read_text()):
        apply(change, destination)
    return target


def parse(text: str) -> list[FileChange]:
    """The file changes of a unified diff (``--- a/<path>`` / ``+++ b/<path>`` / ``@@`` hunks); text
    before the first file is a description."""
    changes: list[FileChange] = []
    lines = text.splitlines()
    position = 0
    while position < len(lines):
        if not (lines[position].startswith("--- ") and position + 1 < len(lines)):
            position += 1
            continue
        path = lines[position + 1][4:].split("\t")[0]
        path = path[2:] if path.startswith("b/") else path
        position += 2
        hunks = []
        while position < len(lines) and (match := _HUNK.match(lines[position])):
            old_count = int(match.group(2) or 1)
            new_count = int(match.group(4) or 1)
            old: list[str] = []
            new: list[str] = []
            position += 1
            while len(old) < old_count or len(new) < new_count:
                line = lines[position]
                kind, body = (line[:1], line[1:]) if line else (" ", "")
                if kind in (" ", "-"):
                    old.append(body)
                if kind in (" ", "+"):
                    new.append(body)
                if kind not in (" ", "-", "+", "\\"):
                    raise ValueError(f"malformed hunk line {position + 1}: {line!r}")
                position += 1
            hunks.append(Hunk(int(match.group(1)), tuple(old), tuple(new)))
        changes.append(FileChange(path, tuple(hunks)))
    return changes


def apply(change: FileChange, root: Path) -> None:
    """Apply ``change`` to its file under ``root``: each hunk where its old lines are, at or after
    the line it names (shifted by what the hunks before it added)."""
    path = root / change.path
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise BackendBuildError(
            f"cannot apply the project's change to the pytorch backend: {error}"
        ) from error
    shift = 0
    searched_from = 0
    for hunk in change.hunks:
        at = _find(lines, hunk.old, max(hunk.start - 1 + shift, searched_from), searched_from)
        if at is None:
            raise BackendBuildError(
                f"cannot apply the project's change to the pytorch backend: {change.path} differs"
                f" from the release it was made for near its line {hunk.start} (expected"
                f" {hunk.old[0] if hunk.old else 'the end of the file'!r}); build from the"
                " sources of the release matching the bundled tritonserver (r24.10)"
            )
        lines[at : at + len(hunk.old)] = hunk.new
        shift = at + len(hunk.new) - (hunk.start - 1 + len(hunk.old))
        searched_from = at + len(hunk.new)
    path.write_text("\n".join(lines) + "\n")


def _find(lines: list[str], block: tuple[str, ...], expected: int, earliest: int) -> int | None:
    """Where ``block`` starts in ``lines``: at ``expected`` if it is there, else its first place at
    or after ``earliest``."""
    size = len(block)
    if tuple(lines[expected : expected + size]) == block:
        return expected
    for start in range(earliest, len(lines) - size + 1):
        if tuple(lines[start : start + size]) == block:
            return start
    return None
