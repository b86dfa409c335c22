"""The documentation site builds with --strict (no broken link, anchor or reference), and its API
reference documents every public name of the package with its docstring."""

from __future__ import annotations

import html
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import merlin_torch_serving

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return site


def visible_text(page: str) -> str:
    """What a reader sees of an HTML page, without whitespace (markup splits words apart)."""
    return "".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())


def first_paragraph(docstring: str) -> str:
    """A docstring's first paragraph as the page shows it (reST's ``code`` marks rendered),
    without whitespace."""
    return "".join(docstring.split("\n\n", 1)[0].replace("``", "").split())


def test_the_reference_documents_every_public_name_with_its_docstring(site):
    pages = {path: path.read_text() for path in (site / "reference").glob("*.html")}
    assert len(pages) > 5
    missing, undocumented = [], []
    for name in merlin_torch_serving.__all__:
        anchor = re.compile(rf'id="merlin_torch_serving(\.\w+)*\.{re.escape(name)}"')
        holding = [page for page in pages.values() if anchor.search(page)]
        if not holding:
            missing.append(name)
            continue
        # its own docstring, not one inherited from a base class
        docstring = inspect.cleandoc(getattr(merlin_torch_serving, name).__doc__ or "")
        assert docstring, f"{name} has no docstring"
        if first_paragraph(docstring) not in visible_text(holding[0]):
            undocumented.append((name, first_paragraph(docstring)))
    assert missing == []
    assert undocumented == []


def test_the_site_has_every_page_of_the_navigation_and_the_benchmark_chart(site):
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in re.findall(r"^\s+- (?:[\w ]+: )?([\w/.-]+\.md)$", nav, flags=re.M):
        assert (site / page.replace(".md", ".html")).is_file(), page
    assert (site / "benchmarks" / "results" / "latest.png").read_bytes()[:4] == b"\x89PNG"
    assert 'src="benchmarks/results/latest.png"' in (site / "benchmarks.html").read_text()
