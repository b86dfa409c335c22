"""The README's complete example, run as a user pastes it: its python block, fed to this
interpreter at the root of the checkout. It trains, exports, serves on a real tritonserver and
compares the served answer with the in-process one itself."""

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


def test_the_readme_example_runs_as_written_and_serves_what_it_computes_in_process(tmp_path):
    example = readme_example()
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


def test_the_readme_gives_predictpytorch_with_every_parameter_and_default_of_its_signature():
    import inspect

    from merlin_torch_serving import PredictPytorch

    parts, keyword_only = [], False
    for parameter in inspect.signature(PredictPytorch).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        default = parameter.default
        parts.append(
            parameter.name
            if default is parameter.empty
            else f"{parameter.name}={repr(default).replace(chr(39), chr(34))}"
        )
    row = f"| `PredictPytorch({', '.join(parts)})` |"
    assert row in (ROOT / "README.md").read_text(), row
