"""The documentation's batch-scoring example, run as a user pastes it into an interactive session
(see test_readme.py): it exports a small model, scores a click log cut into daily files on a local
cluster of two worker processes and checks the answers itself."""

from __future__ import annotations

import re

from tests.examples.test_readme import readme_example, run_example


def test_the_readme_scoring_example_runs_as_written(tmp_path):
    example = readme_example("Batch scoring on Dask")
    assert "score_dataset(" in example

    # pasted: the local cluster's worker processes import the main module's file, which a script
    # read from standard input does not have (the library refuses that case, see below)
    result = run_example(example, tmp_path, timeout_s=600, pasted=True)

    assert result.returncode == 0, result.stderr[-4000:]
    [line] = result.stdout.strip().splitlines()
    assert re.fullmatch(r"\d+ sessions in 1 part files, [\d.]+ s", line), line
    assert "scored 1/1 partitions" in result.stderr  # progress, shown by default


def test_a_local_cluster_is_refused_to_a_script_read_from_standard_input(tmp_path):
    script = "from merlin_torch_serving import score_dataset\nscore_dataset('r', 'i', 'o')\n"

    result = run_example(script, tmp_path, timeout_s=120)

    assert result.returncode == 1
    assert "ScoringError: run the code from a file, in an interactive session, or pass client=" in (
        result.stderr
    )
