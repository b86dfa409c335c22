"""The README's complete example, run as a user pastes it: its python block, fed to this
interpreter at the root of the checkout, then the blocks of the documentation that continue it in
the same interpreter: the pages on the workflow in TorchScript, on routing and on the answer log.
They train, export, serve on real tritonservers (one with the pytorch backend alone), compare the
served answers with the in-process ones and read an experiment out themselves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def section(heading: str, paths: list[Path] | None = None) -> str:
    """The text under the heading ``heading`` (its words, without the ``#``) in README.md or a
    page of docs/ (or ``paths``), the first that has it, up to the next heading of the same level
    or higher: the documentation's sections are found wherever a page puts them."""
    for path in paths or [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        level, found, in_code = 0, [], False
        for line in path.read_text().splitlines():
            if line.startswith("```"):
                in_code = not in_code
            title = None if in_code else re.fullmatch(r"(#+) (.*)", line)
            if title and level and len(title.group(1)) <= level:
                break
            if title and not level and title.group(2) == heading:
                level = len(title.group(1))
            elif level:
                found.append(line)
        if level:
            return "\n".join(found)
    raise AssertionError(f"no heading {heading!r} in README.md or docs/")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def readme_example(heading: str = "A complete example") -> str:
    """The first python block under ``heading`` in the README or the documentation."""
    blocks = python_blocks(section(heading))
    assert blocks, f"the section {heading!r} has no python block"
    return blocks[0]


def run_example(
    example: str, tmp_path: Path, timeout_s: float, *, pasted: bool = False
) -> subprocess.CompletedProcess:
    """``example`` fed to this interpreter at the root of the checkout, its temporary folders in
    ``tmp_path`` (the examples keep theirs for the reader; here pytest cleans up). ``pasted``: run
    as in an interactive session, whose main module has no file (``-c``), not as a script read
    from standard input."""
    return subprocess.run(
        [sys.executable, *(["-c", example] if pasted else ["-"])],
        input=None if pasted else example,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_the_readme_example_runs_as_written_and_serves_what_it_computes_in_process(
    tmp_path, pytorch_backend
):
    example = readme_example()
    scripted = readme_example("No Python in the serving path: the workflow in TorchScript")
    routing = readme_example("Routing: fallbacks and experiments")
    answer_log = readme_example("The answer log: what was shown, and did it work")
    assert "TritonServer(" in example
    assert "Client(" in example
    assert ".export(" in example
    chain = "\n".join([example, scripted, routing, answer_log])
    result = run_example(chain, tmp_path, timeout_s=900)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 6, result.stdout  # one line per requested session, in each example
    for line in lines[:3]:
        assert re.fullmatch(r"session \d+: recommended \[(\d+, ){9}\d+\]", line), line
    for line in lines[3:]:
        pattern = r"session \d+: (current|candidate) answered by (current|candidate|popular)"
        assert re.fullmatch(pattern, line), line


def test_getting_started_shows_the_readme_example_unchanged():
    readme = python_blocks(section("A complete example", [ROOT / "README.md"]))
    page = python_blocks(section("A complete example", [ROOT / "docs" / "getting-started.md"]))
    assert readme
    assert page == readme


def test_the_graph_page_gives_predictpytorch_with_every_parameter_and_default_of_its_signature():
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
    assert row in (ROOT / "docs" / "concepts" / "graph.md").read_text(), row
