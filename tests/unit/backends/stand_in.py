"""Sources for the build tests: the release tarball CI keeps, and stand-in sources holding the lines
of upstream's ``src/libtorch.cc`` that the project's change replaces, so that the change applies to
them as it does to the release."""

from __future__ import annotations

import os
from pathlib import Path

from merlin_torch_serving.backends import pytorch_change

ROOT = Path(__file__).resolve().parents[3]
# where CI keeps the release sources, beside the clone (see .ci/run)
SHARED_SOURCES = ROOT.parent / "shared" / "triton-pytorch-backend" / "sources-r24.10.tar.gz"


def release_sources() -> Path:
    """The release tarball: $MTS_PYTORCH_BACKEND_SOURCES, else where CI keeps it."""
    given = os.environ.get("MTS_PYTORCH_BACKEND_SOURCES")
    path = Path(given) if given else SHARED_SOURCES
    assert path.is_file(), (
        f"the release sources {path} are missing; set MTS_PYTORCH_BACKEND_SOURCES to the"
        " sources-r24.10.tar.gz of Triton's pytorch_backend"
    )
    return path


def write_changed_file(pytorch_backend: Path) -> None:
    """``pytorch_backend/src/libtorch.cc`` holding only the lines the change expects."""
    (change,) = pytorch_change.parse(pytorch_change.PATCH_FILE.read_text())
    lines = [line for hunk in change.hunks for line in hunk.old]
    (pytorch_backend / "src").mkdir(parents=True, exist_ok=True)
    (pytorch_backend / "src" / "libtorch.cc").write_text("\n".join(lines) + "\n")
