"""The README's batch-scoring example, run as a user pastes it: its first python block, fed to this
interpreter at the root of the checkout. It exports a small model, scores a click log cut into
daily files on a local cluster of two worker processes and checks the answers itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def scoring_example() -> str:
    """The first python block of the README's "Batch scoring on Dask" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Batch scoring on Dask\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's batch-scoring section has no python block"
    return blocks[0]


def test_the_readme_scoring_example_runs_as_written(tmp_path):
    example = scoring_example()
    assert "score_dataset(" in example
    result = subprocess.run(
        [sys.executable, "-"],
        input=example,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    [line] = result.stdout.strip().splitlines()
    assert re.fullmatch(r"\d+ sessions in \d+ part files, [\d.]+ s", line), line
    assert "scored 1/1 partitions" in result.stderr  # progress, shown by default
