"""The README's complete example, run as a user pastes it: its python block, fed to this
interpreter at the root of the checkout, then the block of the section on the workflow in
TorchScript, which continues it. They train, export, serve on real tritonservers (the second with
the pytorch backend alone) and compare the served answers with the in-process ones themselves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    """The first python block of the README's "A complete example" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## A complete example\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's complete example has no python block"
    return blocks[0]


def continued_example() -> str:
    """The python block of the README's section on the workflow in TorchScript."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## No Python in the serving path", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's section on the workflow in TorchScript has no python block"
    return blocks[0]


def test_the_readme_example_runs_as_written_and_serves_what_it_computes_in_process(
    tmp_path, pytorch_backend
):
    example = readme_example() + "\n" + continued_example()
    assert "TritonServer(" in example
    assert "Client(" in example
    assert ".export(" in example
    # the example keeps its folder for serving afterwards; here it goes where pytest cleans up
    result = subprocess.run(
        [sys.executable, "-"],
        input=example,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3, result.stdout  # one line per requested session
    for line in lines:
        assert re.fullmatch(r"session \d+: recommended \[(\d+, ){9}\d+\]", line), line
