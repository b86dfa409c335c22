"""What each deployment image copies, measured on this machine (there is no container daemon here
to build them): ``deploy/Dockerfile`` copies a virtualenv of the library with its ``server`` and
``s3`` extras (and the cache of backend layouts, links into it), ``deploy/Dockerfile.libtorch`` the
runtime without Python (``backends.runtime``). Base images come on top of both
(``python:3.11-slim-bookworm`` and ``debian:bookworm-slim``).

    ./run python benchmarks/image_sizes.py
"""

from __future__ import annotations

import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:
    sys.path.insert(0, str(REPOSITORY_ROOT))

from merlin_torch_serving.backends.runtime import lay_out_libtorch_runtime  # noqa: E402

PYTHON_IMAGE_EXTRAS = ("server", "s3")
_MB = 2**20


def installed_closure(distribution: str, extras: tuple[str, ...]) -> dict[str, int]:
    """Installed bytes of every distribution ``distribution[extras]`` needs, by name (from the
    files each distribution's RECORD lists, as installed here)."""
    sizes: dict[str, int] = {}
    pending = [(distribution, set(extras))]
    while pending:
        name, wanted = pending.pop()
        key = name.lower().replace("_", "-")
        if key in sizes:
            continue
        try:
            found = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement of another platform or Python, not installed here
        sizes[key] = sum(file.size or 0 for file in found.files or [])
        for line in found.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in wanted | {""}):
                pending.append((requirement.name, set(requirement.extras)))
    return sizes


def runtime_bytes() -> int:
    """The bytes of the runtime without Python, laid out into a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="libtorch-runtime-") as scratch:
        lay_out_libtorch_runtime(Path(scratch) / "runtime")
        return sum(
            path.stat().st_size
            for path in (Path(scratch) / "runtime").rglob("*")
            if path.is_file() and not path.is_symlink()
        )


def main() -> int:
    closure = installed_closure("merlin-torch-serving", PYTHON_IMAGE_EXTRAS)
    largest = sorted(closure.items(), key=lambda item: -item[1])[:8]
    python_total = sum(closure.values())
    runtime = runtime_bytes()
    print(f"deploy/Dockerfile copies a virtualenv of {len(closure)} distributions:")
    print(f"  {python_total / _MB:,.0f} MB, the largest: ")
    print("  " + ", ".join(f"{name} {size / _MB:,.0f} MB" for name, size in largest))
    print(f"deploy/Dockerfile.libtorch copies the runtime without Python: {runtime / _MB:,.0f} MB")
    print(f"ratio: {runtime / python_total:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
