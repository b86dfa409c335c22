"""The score command's options: defaults from the library, bad values refused by the parser."""

from __future__ import annotations

import pytest

from merlin_torch_serving.cli.arguments import build_parser
from merlin_torch_serving.scoring.sizes import DEFAULT_BATCH_SESSIONS, DEFAULT_PARTITION_ROWS


def test_score_takes_repository_input_and_output_with_the_library_defaults():
    args = build_parser().parse_args(["score", "models", "clicks/", "scores/"])

    assert (args.repository, args.input, args.output) == ("models", "clicks/", "scores/")
    assert (args.scheduler, args.workers, args.overwrite) == (None, None, False)
    assert (args.partition_rows, args.batch_sessions) == (
        DEFAULT_PARTITION_ROWS,
        DEFAULT_BATCH_SESSIONS,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--workers", "0"], "argument --workers: a whole number of 1 or more, got '0'"),
        (["--partition-rows", "many"], "argument --partition-rows: a whole number of 1 or more"),
        (["--workers", "2", "--scheduler", "tcp://h:8786"], "not allowed with argument --workers"),
    ],
)
def test_bad_options_are_refused_naming_them(options, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["score", "models", "clicks/", "scores/", *options])

    assert message in capsys.readouterr().err
