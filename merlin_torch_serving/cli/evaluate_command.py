"""The read-out on the command line:

merlin-torch-serving evaluate LOG --clicks CLICKS [--window 30min] [--k 5 --k 10] [--control NAME]
                              [--chart readout.png] [--impressions impressions.parquet]

LOG is an answer log's folder or the Redis server of its stream (redis://, rediss://, unix://;
its password from the environment variable --password-env names). Prints the table, writes the
chart and, when asked, the impressions dataset.
"""

from __future__ import annotations

import argparse
import os
import urllib.parse

import pandas as pd

from merlin_torch_serving.stores.settings import REDIS_SCHEMES


def add_evaluate_command(commands, common: argparse.ArgumentParser) -> None:
    """The ``evaluate`` command, added to ``commands`` (the parser's subparsers)."""
    sub = commands.add_parser(
        "evaluate",
        parents=[common],
        help="read out an answer log against the clicks that followed: per variant, per branch",
    )
    sub.add_argument("log", help="the answer log: its folder, or a Redis URL of its stream")
    sub.add_argument("--clicks", required=True, help="a parquet or CSV file of clicks")
    sub.add_argument(
        "--window",
        type=pd.Timedelta,
        help="how long after an answer a click counts (default 30min)",
    )
    sub.add_argument(
        "--k",
        dest="ks",
        type=int,
        action="append",
        metavar="K",
        help="a list length to judge (repeat it; default 5 and 10)",
    )
    sub.add_argument("--control", help="the variant the others are compared with")
    sub.add_argument("--catalog", type=int, help="the catalogue's size, for coverage")
    sub.add_argument("--session-column", default="session_id")
    sub.add_argument("--item-column", default="item_id")
    sub.add_argument(
        "--time-column", default="timestamp", help="seconds since the epoch, or datetimes"
    )
    sub.add_argument(
        "--session-id-key-env",
        metavar="VARIABLE",
        help="the environment variable holding the key the log hashed session ids with",
    )
    sub.add_argument("--chart", default="readout.png", help="the chart's PNG (default %(default)s)")
    sub.add_argument("--impressions", help="write every shown item, clicked or not, to .parquet")
    redis = sub.add_argument_group("a log in a Redis stream")
    redis.add_argument("--stream", default="answers", help="the stream's name (default answers)")
    redis.add_argument("--key-prefix", default="mts", help="the prefix the log was exported with")
    redis.add_argument("--password-env", metavar="VARIABLE")
    redis.add_argument("--ca-file", help="rediss: the CA that signed the server's certificate")
    sub.set_defaults(run=evaluate)


def evaluate(args) -> int:
    from merlin_torch_serving.evaluation import ClickColumns, evaluate_answers
    from merlin_torch_serving.evaluation.impressions import write_impressions

    key = os.environ.get(args.session_id_key_env) if args.session_id_key_env else None
    # what is not given takes evaluate_answers' defaults
    given = {"window": args.window, "ks": args.ks}
    readout = evaluate_answers(
        _log(args),
        args.clicks,
        **{name: value for name, value in given.items() if value is not None},
        catalog=args.catalog,
        control=args.control,
        columns=ClickColumns(args.session_column, args.item_column, args.time_column),
        session_id_key=key,
    )
    print(readout.table())
    print(f"chart: {readout.chart(args.chart)}")
    if args.impressions:
        frame = readout.impressions()
        path = write_impressions(frame, args.impressions)
        print(
            f"impressions: {path} ({len(frame):,} shown items, {int(frame['clicked'].sum()):,}"
            " clicked)"
        )
    return 0


def _log(args):
    if urllib.parse.urlsplit(args.log).scheme not in REDIS_SCHEMES:
        return args.log
    from merlin_torch_serving.answer_log import RedisStream
    from merlin_torch_serving.stores.settings import RedisSettings

    settings = RedisSettings(
        args.log,
        password_env=args.password_env,
        ca_file=args.ca_file,
        key_prefix=args.key_prefix,
        timeout_s=10.0,
        connect_timeout_s=10.0,
    )
    return RedisStream(settings, stream=args.stream)
