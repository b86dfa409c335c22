"""The command line's arguments: one parser, its subcommands and their options."""

from __future__ import annotations

import argparse

from merlin_torch_serving.cli.commands import (
    build_backend,
    bundle,
    deploy_fields,
    deploy_files,
    infer,
    models,
    score,
    serve,
    version_report,
)
from merlin_torch_serving.cli.evaluate_command import add_evaluate_command
from merlin_torch_serving.cli.store_commands import add_store_commands
from merlin_torch_serving.client import column_names
from merlin_torch_serving.launcher.access import (
    ADMIN_KEY_ENV_VAR,
    ADMIN_KEY_HEADER,
    DEFAULT_RESTRICTED_APIS,
    LOOPBACK_HOST,
    checked_restricted_apis,
)
from merlin_torch_serving.launcher.config import DEFAULT_MEMORY_GROWTH_LIMIT
from merlin_torch_serving.scoring.sizes import DEFAULT_BATCH_SESSIONS, DEFAULT_PARTITION_ROWS

DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT = 8000, 8001, 8002


class _VersionAction(argparse.Action):
    """--version, worked out only when asked for (finding the server's version runs it once)."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_report())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="merlin-torch-serving",
        description=(
            "Serve session-based PyTorch recommenders and their NVTabular workflows on Triton."
        ),
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--version",
        action=_VersionAction,
        help="show the versions of this library and tritonserver",
    )
    common.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="show tritonserver's log tail with server errors",
    )
    parser._add_action(common._actions[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve_parser = commands.add_parser(
        "serve",
        parents=[common],
        help="run tritonserver on a model repository (foreground)",
        usage="%(prog)s REPOSITORY [options] [-- TRITONSERVER ARGS ...]",
        epilog=(
            "Arguments after '--' go to tritonserver as they are, e.g. "
            "`-- --cache-config=local,size=104857600 --log-info=true`."
        ),
    )
    serve_parser.add_argument(
        "repository",
        help=(
            "the model repository: a folder (e.g. what Ensemble.export wrote) or an s3://, gs:// or"
            " as:// URL (an S3-compatible store at an endpoint of its own:"
            " s3://http://HOST:PORT/BUCKET/PATH)"
        ),
    )
    for protocol, default in (
        ("http", DEFAULT_HTTP_PORT),
        ("grpc", DEFAULT_GRPC_PORT),
        ("metrics", DEFAULT_METRICS_PORT),
    ):
        serve_parser.add_argument(
            f"--{protocol}-port",
            type=int,
            default=default,
            metavar="PORT",
            help="default %(default)s; 0 lets the OS choose a free one",
        )
    serve_parser.add_argument(
        "--host",
        default=LOOPBACK_HOST,
        metavar="ADDRESS",
        help=(
            "the address to listen on (default %(default)s: this machine only; 0.0.0.0: every"
            " interface). Whatever it is, the admin APIs want the admin key"
        ),
    )
    serve_parser.add_argument(
        "--restricted-apis",
        type=_restricted_apis,
        default=DEFAULT_RESTRICTED_APIS,
        metavar="API,...",
        help=(
            "the APIs that answer only requests carrying the admin key in the"
            f" {ADMIN_KEY_HEADER!r} header (default: {','.join(DEFAULT_RESTRICTED_APIS)}; '' lifts"
            f" the restriction). The key is ${ADMIN_KEY_ENV_VAR} when set, else made anew and"
            " written to a file only you can read (printed when ready)"
        ),
    )
    serve_parser.add_argument(
        "--model-control", choices=("none", "explicit", "poll"), default="none"
    )
    serve_parser.add_argument(
        "--load", action="append", metavar="MODEL", help="with explicit control: load at start"
    )
    serve_parser.add_argument(
        "--poll-interval",
        type=int,
        default=5,
        metavar="SECONDS",
        help="with poll control: how often the repository is read",
    )
    serve_parser.add_argument(
        "--no-restart-failed-models",
        dest="restart_failed_models",
        action="store_false",
        help="do not reload a model whose python-backend stub died (health is still reported)",
    )
    serve_parser.add_argument(
        "--no-failover",
        dest="failover",
        action="store_false",
        default=None,
        help=(
            "run python steps as exported, without the second instance and the standby that make"
            " a dying stub fail only the requests inside it (each costs about what the step's"
            " stub takes; $MTS_FAILOVER=0 does the same)"
        ),
    )
    serve_parser.add_argument(
        "--memory-growth-limit",
        type=_memory_growth_limit,
        default=DEFAULT_MEMORY_GROWTH_LIMIT,
        metavar="FRACTION",
        help=(
            "start a python model afresh (no request fails) once its idle stubs hold this"
            " fraction, and 32 MB, more than they started with (default %(default)s; 0: never)"
        ),
    )
    serve_parser.add_argument("--start-timeout", type=float, default=300.0, metavar="SECONDS")
    serve_parser.set_defaults(run=serve)

    bundle_parser = commands.add_parser(
        "bundle",
        parents=[common],
        help=(
            "copy a model repository so that it serves on a tritonserver whose Python lacks this"
            " library"
        ),
        description=(
            "Copy REPOSITORY to OUT, giving every python step a packed Python environment (this"
            " Python, its standard library, and the installed distributions this library needs to"
            " serve), the python-backend stub for that Python, and EXECUTION_ENV_PATH pointing at"
            " it. NVIDIA's tritonserver containers then serve OUT without installing anything."
        ),
    )
    bundle_parser.add_argument("out", help="the folder to write (must not exist)")
    bundle_parser.add_argument(
        "--with",
        dest="with_distributions",
        action="append",
        metavar="DIST",
        help=(
            "also pack this installed distribution and its requirements (e.g. transformers4rec for"
            " an eager model)"
        ),
    )
    bundle_parser.add_argument(
        "--archive",
        action="store_true",
        help=(
            "ship the environment as python-env.tar.gz (one file, extracted by the server at load)"
            " instead of a folder"
        ),
    )
    bundle_parser.add_argument(
        "--environment", metavar="FOLDER", help="reuse an environment packed by an earlier bundle"
    )
    bundle_parser.set_defaults(run=bundle)

    deploy_parser = commands.add_parser(
        "deploy-files",
        parents=[common],
        help=(
            "write a Dockerfile, Kubernetes manifests and a KServe InferenceService for a"
            " repository"
        ),
        description=(
            "Render the deployment files (Dockerfile; k8s/ Deployment, Service,"
            " HorizontalPodAutoscaler, PodDisruptionBudget, prometheus-adapter rule; kserve/"
            " InferenceService) into OUT, from one set of settings so that ports, repository,"
            " shared memory and cache agree. Unset options keep the defaults of the repository's"
            " own deploy/ folder."
        ),
    )
    deploy_parser.add_argument("out", help="the folder to write into (files there are replaced)")
    for field in deploy_fields():
        deploy_parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(field.default),
            default=None,
            help=f"default: {field.default}",
        )
    deploy_parser.set_defaults(run=deploy_files)

    build_parser = commands.add_parser(
        "build-backend",
        parents=[common],
        help=(
            "build Triton's pytorch (libtorch) backend for the bundled tritonserver and this torch"
            " (cached)"
        ),
        description=(
            "Build libtriton_pytorch.so for the tritonserver bundled with nvidia-pytriton and the"
            " torch of this interpreter, into the cache ($MTS_CACHE_DIR, else"
            ' ~/.cache/merlin_torch_serving); TritonServer then serves `backend: "pytorch"` models.'
            " Needs cmake, ninja or make, and a C++ compiler; takes under a minute on 2 cores, and"
            " a second call with the same torch returns at once."
        ),
    )
    build_parser.add_argument("backend", choices=("pytorch",), help="the backend to build")
    build_parser.add_argument(
        "--sources",
        metavar="PATH",
        help=(
            "a .tar.gz or folder holding pytorch_backend/, backend/, core/, common/ and rapidjson/"
            " at the server's release (builds offline); without it, the release is cloned from"
            " upstream (needs git and the network; $MTS_PYTORCH_BACKEND_GIT_HOST names a mirror"
            " instead of GitHub)"
        ),
    )
    build_parser.add_argument(
        "--skip-if-unreachable",
        action="store_true",
        help=(
            "without --sources: when the release cannot be cloned (no git, no network), say so"
            " and exit 0 instead of failing (what ./run setup does)"
        ),
    )
    build_parser.add_argument(
        "--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: all cores)"
    )
    build_parser.add_argument(
        "--check", action="store_true", help="only say whether it is built (exit code 1 if not)"
    )
    build_parser.set_defaults(run=build_backend)

    score_parser = commands.add_parser(
        "score",
        parents=[common],
        help="score every session of a dataset with an exported ensemble on a Dask cluster",
        description=(
            "Answer every session of INPUT with the ensemble exported into REPOSITORY, as a server"
            " of it answers, on a Dask cluster, and write the answers into OUTPUT as parquet files"
            " (one row per session). A rerun keeps the files an earlier run of the same export"
            " and input wrote and scores the rest."
        ),
    )
    score_parser.add_argument("repository", help="the folder Ensemble.export wrote into")
    score_parser.add_argument(
        "input", help="a folder, file or glob of parquet files of raw rows (clicks)"
    )
    score_parser.add_argument("output", help="the folder to write the answers into")
    score_parser.add_argument(
        "--name", default=None, metavar="MODEL", help="the ensemble, when REPOSITORY holds several"
    )
    cluster = score_parser.add_mutually_exclusive_group()
    cluster.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="a Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: a local cluster)",
    )
    cluster.add_argument(
        "--workers",
        type=_positive,
        default=None,
        metavar="N",
        help="worker processes of the local cluster, which listens on loopback only (default: one"
        " per core)",
    )
    score_parser.add_argument(
        "--columns",
        type=column_names.argument,
        default=None,
        metavar="YOURS=INPUT,...",
        help="the input's column names for the ensemble's inputs, e.g. user_session=session_id",
    )
    score_parser.add_argument(
        "--partition-rows",
        type=_positive,
        default=DEFAULT_PARTITION_ROWS,
        metavar="ROWS",
        help="about how many rows one partition (one part file) holds (default %(default)s)",
    )
    score_parser.add_argument(
        "--batch-sessions",
        type=_positive,
        default=DEFAULT_BATCH_SESSIONS,
        metavar="SESSIONS",
        help="sessions per run of the ensemble within a partition (default %(default)s)",
    )
    score_parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the answers of another run found in OUTPUT",
    )
    score_parser.set_defaults(run=score)

    for name, function, help_text in (
        (
            "infer",
            infer,
            "send the rows of a parquet or CSV file to a served model and show the answer",
        ),
        ("models", models, "list the models the server knows, with version and state"),
    ):
        sub = commands.add_parser(name, parents=[common], help=help_text)
        if name == "infer":
            sub.add_argument("model", help="the ensemble's model name")
            sub.add_argument("file", help="a .parquet or .csv file of raw rows")
            sub.add_argument(
                "--output",
                "-o",
                help="write the answer to .parquet, .csv or .json instead of printing",
            )
            sub.add_argument(
                "--head",
                type=int,
                default=None,
                metavar="N",
                help="print only the first N rows of the answer",
            )
            sub.add_argument(
                "--columns",
                type=column_names.argument,
                default=None,
                metavar="YOURS=INPUT,...",
                help=(
                    "the file's column names for the model's inputs, e.g."
                    " user_session=session_id,product=item_id"
                ),
            )
            sub.add_argument(
                "--max-rows",
                type=int,
                default=None,
                metavar="ROWS",
                help=(
                    "rows per request; bigger files go in requests of whole sessions (default: the"
                    " model's limit)"
                ),
            )
            sub.add_argument(
                "--wait",
                type=float,
                default=30.0,
                metavar="SECONDS",
                help="how long to wait for the model to be ready",
            )
            sub.add_argument(
                "--retries",
                type=int,
                default=3,
                help="how often to retry errors that are safe to retry",
            )
        sub.add_argument(
            "--timeout", type=float, default=60.0, metavar="SECONDS", help="per request"
        )
        sub.add_argument(
            "--url",
            default=None,
            help=(
                f"host:port, no scheme (default: localhost:{DEFAULT_GRPC_PORT} for grpc,"
                f" localhost:{DEFAULT_HTTP_PORT} for http)"
            ),
        )
        sub.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
        sub.set_defaults(run=function)
    add_store_commands(commands, common)
    add_evaluate_command(commands, common)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of 1 or more, got {text!r}")
    return value


def _memory_growth_limit(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a fraction such as 0.05, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a fraction of 0 (never) or more, got {text!r}")
    return value or None


def _restricted_apis(text: str) -> tuple[str, ...]:
    try:
        return checked_restricted_apis(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def default_url(args) -> None:
    if getattr(args, "url", "") is None:
        args.url = (
            f"localhost:{DEFAULT_GRPC_PORT if args.protocol == 'grpc' else DEFAULT_HTTP_PORT}"
        )
