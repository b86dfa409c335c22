"""The benchmark's chart is drawn from a results file, without measuring, and is shown where
readers look: in the results page, the documentation's benchmark page and the README."""

import shutil
from pathlib import Path

from benchmarks import chart

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def test_the_chart_is_redrawn_from_the_saved_results(tmp_path):
    results = shutil.copy(RESULTS / "latest.json", tmp_path / "latest.json")
    drawn = chart.redraw(Path(results))
    assert drawn == tmp_path / "latest.png"
    assert drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_results_page_embeds_the_chart_and_the_docs_and_the_readme_show_it():
    assert "](latest.png)" in (RESULTS / "latest.md").read_text()
    assert "](benchmarks/results/latest.png)" in (ROOT / "docs" / "benchmarks.md").read_text()
    assert "](benchmarks/results/latest.png)" in (ROOT / "README.md").read_text()
