"""The ``merlin-torch-serving`` command: thin wrappers over TritonServer and Client.

merlin-torch-serving serve REPOSITORY [-- TRITONSERVER ARGS]
                                           run tritonserver in the foreground (Ctrl-C stops it)
merlin-torch-serving infer MODEL FILE      send a parquet/CSV file of rows, print the answer
merlin-torch-serving models                what the server has loaded, and whether it answers
merlin-torch-serving bundle REPOSITORY OUT  a copy that serves where the server's Python lacks this library
merlin-torch-serving deploy-files OUT      a Dockerfile, Kubernetes manifests and a KServe InferenceService
merlin-torch-serving build-backend pytorch [--sources PATH]
                                           build Triton's libtorch backend for this torch
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from merlin_torch_serving import column_names
from merlin_torch_serving.exceptions import MerlinTorchServingError, PortInUseError, ServerError

DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT = 8000, 8001, 8002


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after the first "--" goes to tritonserver unchanged
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - 1] if "--" in argv else argv)
    if extra and args.command != "serve":
        parser.error(
            f"only `serve` passes arguments after '--' on (to tritonserver); got {extra!r}"
        )
    args.tritonserver_args = extra
    _default_url(args)
    try:
        return args.run(args)
    except MerlinTorchServingError as error:
        print(f"error: {_without_log(error, args.verbose)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _without_log(error: MerlinTorchServingError, verbose: bool) -> str:
    """The error's message; tritonserver's log tail only with --verbose (its first line says what to do)."""
    if isinstance(error, ServerError) and error.log_tail and not verbose:
        return f"{error.summary}\n(--verbose shows the last lines of tritonserver's log)"
    return str(error)


def serve(args) -> int:
    from merlin_torch_serving.server import TritonServer

    # the supervisor says here when a model failed and was reloaded
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    # Until it serves, Ctrl-C (KeyboardInterrupt) and SIGTERM end start-up at once: start() kills
    # the half-started server and re-raises; once it serves, they stop it gracefully.
    signal.signal(signal.SIGTERM, _interrupt)
    stop = threading.Event()
    server = TritonServer(
        args.repository,
        http_port=args.http_port or None,
        grpc_port=args.grpc_port or None,
        metrics_port=args.metrics_port or None,
        model_control=args.model_control,
        load_models=args.load or (),
        poll_interval_s=args.poll_interval,
        restart_failed_models=args.restart_failed_models,
        start_timeout_s=args.start_timeout,
        extra_args=args.tritonserver_args,
    )
    print(
        f"starting tritonserver on {args.repository}: loading its models (Ctrl-C stops) ...",
        flush=True,
    )
    try:
        server.start()
    except PortInUseError as error:
        flag = f"--{error.protocol.lower()}-port"
        hint = f"pass {flag} 0 (the OS picks a free port, printed when ready) or another free port"
        raise PortInUseError(error.port, error.protocol, error.log_tail, hint=hint) from None
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        print(f"tritonserver is ready (pid {server.pid})")
        print(f"  gRPC    {server.grpc_url}")
        print(f"  HTTP    {server.http_url}")
        print(f"  metrics {server.metrics_url}")
        _print_models(server.health())
        print("press Ctrl-C to stop", flush=True)
        while not stop.wait(0.5):
            if not server.is_running:
                print(
                    "error: tritonserver exited on its own; its log:\n" + server.logs()[-4000:],
                    file=sys.stderr,
                )
                return 1
        print("stopping tritonserver ...", flush=True)
    finally:
        server.stop()
    print("stopped")
    return 0


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def infer(args) -> int:
    import pandas as pd

    from merlin_torch_serving.client import Client

    path = Path(args.file)
    if not path.is_file():
        raise SystemExit(f"error: no such file: {path}")
    rows = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    with Client(
        args.url,
        args.protocol,
        timeout_s=args.timeout,
        max_rows_per_request=args.max_rows,
        retries=args.retries,
    ) as client:
        client.wait_until_ready(args.model, timeout_s=args.wait)
        answer = client.infer(args.model, rows, columns=args.columns, progress=_progress_printer())
    if args.output:
        _write(answer, Path(args.output))
        print(f"wrote {len(answer)} rows to {args.output}")
    else:
        shown = answer if args.head is None else answer.head(args.head)
        with pd.option_context("display.max_colwidth", 120, "display.width", 200):
            print(shown.to_string(index=False))
        if len(shown) < len(answer):
            print(f"({len(shown)} of {len(answer)} rows; -o FILE writes them all)")
    return 0


def models(args) -> int:
    from merlin_torch_serving.client import Client

    with Client(args.url, args.protocol, timeout_s=args.timeout) as client:
        report = client.health()
    _print_models(report)
    return 0 if all(model.healthy or model.state != "READY" for model in report) else 2


def bundle(args) -> int:
    from merlin_torch_serving.bundling import bundle_repository

    result = bundle_repository(
        args.repository,
        args.out,
        environment=args.environment,
        extra_distributions=args.with_distributions or (),
        archive=args.archive,
        progress=lambda line: print(line, flush=True),
    )
    print(
        f"bundled {len(result.python_steps)} python step(s) with Python {result.environment.python_version} and "
        f"{len(result.environment.distributions)} distributions into {result.path}"
    )
    return 0


def deploy_files(args) -> int:
    from merlin_torch_serving import deployment

    settings = deployment.DeploySettings(
        **{
            field.name: getattr(args, field.name)
            for field in _deploy_fields()
            if getattr(args, field.name) is not None
        }
    )
    for path in deployment.write(args.out, settings):
        print(path)
    return 0


def build_backend(args) -> int:
    from merlin_torch_serving.backends.pytorch_build import (
        build_pytorch_backend,
        built_for_running_torch,
    )

    if args.check:
        built = built_for_running_torch()
        if built is None:
            print("no pytorch backend is built for this torch and the bundled tritonserver")
            return 1
    else:
        built = build_pytorch_backend(
            sources=args.sources, jobs=args.jobs, progress=lambda line: print(line, flush=True)
        )
    state = "built now" if built.built_now else "already built"
    print(
        f"pytorch backend for torch {built.torch_version} and tritonserver {built.tritonserver_version} ({state}): {built.library}"
    )
    return 0


def version_report() -> str:
    """This library's version, the Python it runs on, and the tritonserver that `serve` would start."""
    import platform

    from merlin_torch_serving import __version__
    from merlin_torch_serving.backends.bundle import tritonserver_version
    from merlin_torch_serving.server import find_tritonserver

    try:
        binary = find_tritonserver()
        server = f"tritonserver {tritonserver_version(binary) or '(version unknown)'} at {binary}"
    except MerlinTorchServingError:
        server = "no tritonserver found (pip install 'merlin-torch-serving[server]' bundles one)"
    return f"merlin-torch-serving {__version__} (Python {platform.python_version()}; {server})"


class _VersionAction(argparse.Action):
    """--version, worked out only when asked for (finding the server's version runs it once)."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_report())
        parser.exit()


def _print_models(report) -> None:
    """One line per model (``ModelHealth``): version, state, whether its stubs run, failed requests."""
    if not report:
        print("no models")
        return
    width = max(len(m.name) for m in report)
    print(f"{'MODEL':<{width}}  VERSION  {'STATE':<11}  STUBS  FAILED")
    for m in report:
        stubs = {True: "alive", False: "DEAD", None: "-"}[m.stubs_alive]
        failed = "-" if m.failed_requests is None else str(m.failed_requests)
        line = f"{m.name:<{width}}  {str(m.version or '-'):<7}  {m.state or 'not loaded':<11}  {stubs:<5}  {failed:<6}"
        print((line + (f"  ({m.last_error})" if m.last_error else "")).rstrip())


def _progress_printer():
    """Prints, on stderr, how far an input sent in several requests has got."""
    split = False

    def show(sent: int, total: int) -> None:
        nonlocal split
        split = split or sent < total
        if split:
            print(
                f"sent {sent:,} of {total:,} rows ({100 * sent // max(total, 1)} %)",
                file=sys.stderr,
                flush=True,
            )

    return show


def _write(frame, path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame.applymap(lambda v: v.tolist() if hasattr(v, "tolist") else v).to_csv(
            path, index=False
        )
    elif suffix == ".json":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path, index=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="merlin-torch-serving",
        description="Serve session-based PyTorch recommenders and their NVTabular workflows on Triton.",
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
        epilog="Arguments after '--' go to tritonserver as they are, e.g. "
        "`-- --cache-config=local,size=104857600 --log-info=true`.",
    )
    serve_parser.add_argument(
        "repository",
        help="the model repository: a folder (e.g. what Ensemble.export wrote) or an s3://, gs:// or as:// URL "
        "(an S3-compatible store at an endpoint of its own: s3://http://HOST:PORT/BUCKET/PATH)",
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
    serve_parser.add_argument("--start-timeout", type=float, default=300.0, metavar="SECONDS")
    serve_parser.set_defaults(run=serve)

    bundle_parser = commands.add_parser(
        "bundle",
        parents=[common],
        help="copy a model repository so that it serves on a tritonserver whose Python lacks this library",
        description="Copy REPOSITORY to OUT, giving every python step a packed Python environment (this Python, "
        "its standard library, and the installed distributions this library needs to serve), the python-backend "
        "stub for that Python, and EXECUTION_ENV_PATH pointing at it. NVIDIA's tritonserver containers then "
        "serve OUT without installing anything.",
    )
    bundle_parser.add_argument(
        "repository", help="the model repository (e.g. what Ensemble.export wrote)"
    )
    bundle_parser.add_argument("out", help="the folder to write (must not exist)")
    bundle_parser.add_argument(
        "--with",
        dest="with_distributions",
        action="append",
        metavar="DIST",
        help="also pack this installed distribution and its requirements (e.g. transformers4rec for an eager model)",
    )
    bundle_parser.add_argument(
        "--archive",
        action="store_true",
        help="ship the environment as python-env.tar.gz (one file, extracted by the server at load) instead of a folder",
    )
    bundle_parser.add_argument(
        "--environment", metavar="FOLDER", help="reuse an environment packed by an earlier bundle"
    )
    bundle_parser.set_defaults(run=bundle)

    deploy_parser = commands.add_parser(
        "deploy-files",
        parents=[common],
        help="write a Dockerfile, Kubernetes manifests and a KServe InferenceService for a repository",
        description="Render the deployment files (Dockerfile; k8s/ Deployment, Service, HorizontalPodAutoscaler, "
        "PodDisruptionBudget, prometheus-adapter rule; kserve/ InferenceService) into OUT, from one set of "
        "settings so that ports, repository, shared memory and cache agree. Unset options keep the defaults "
        "of the repository's own deploy/ folder.",
    )
    deploy_parser.add_argument("out", help="the folder to write into (files there are replaced)")
    for field in _deploy_fields():
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
        help="build Triton's pytorch (libtorch) backend for the bundled tritonserver and this torch (cached)",
        description="Build libtriton_pytorch.so for the tritonserver bundled with nvidia-pytriton and the torch of "
        "this interpreter, into the cache ($MTS_CACHE_DIR, else ~/.cache/merlin_torch_serving); TritonServer then "
        'serves `backend: "pytorch"` models. Needs cmake, ninja or make, and a C++ compiler; takes under a minute '
        "on 2 cores, and a second call with the same torch returns at once.",
    )
    build_parser.add_argument("backend", choices=("pytorch",), help="the backend to build")
    build_parser.add_argument(
        "--sources",
        metavar="PATH",
        help="a .tar.gz or folder holding pytorch_backend/, backend/, core/, common/ and rapidjson/ at the server's "
        "release (builds offline); without it, the release is cloned from upstream (needs git, the network and "
        "RapidJSON's headers)",
    )
    build_parser.add_argument(
        "--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: all cores)"
    )
    build_parser.add_argument(
        "--check", action="store_true", help="only say whether it is built (exit code 1 if not)"
    )
    build_parser.set_defaults(run=build_backend)

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
                help="the file's column names for the model's inputs, e.g. user_session=session_id,product=item_id",
            )
            sub.add_argument(
                "--max-rows",
                type=int,
                default=None,
                metavar="ROWS",
                help="rows per request; bigger files go in requests of whole sessions (default: the model's limit)",
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
            help=f"host:port, no scheme (default: localhost:{DEFAULT_GRPC_PORT} for grpc, localhost:{DEFAULT_HTTP_PORT} for http)",
        )
        sub.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
        sub.set_defaults(run=function)
    return parser


def _deploy_fields():
    import dataclasses

    from merlin_torch_serving.deployment import DeploySettings

    return dataclasses.fields(DeploySettings)


def _default_url(args) -> None:
    if getattr(args, "url", "") is None:
        args.url = (
            f"localhost:{DEFAULT_GRPC_PORT if args.protocol == 'grpc' else DEFAULT_HTTP_PORT}"
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
