"""What each subcommand does, given its parsed arguments (``arguments.py`` defines them)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

from merlin_torch_serving.exceptions import MerlinTorchServingError, PortInUseError


def serve(args) -> int:
    from merlin_torch_serving.launcher.server import TritonServer

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
        host=args.host,
        restricted_apis=args.restricted_apis,
        failover=args.failover,
        memory_growth_limit=args.memory_growth_limit,
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
        print(f"tritonserver is ready (pid {server.pid}), listening on {_where(server.host)}")
        print(f"  gRPC    {server.grpc_url}")
        print(f"  HTTP    {server.http_url}")
        print(f"  metrics {server.metrics_url}")
        _print_access(server)
        if server.config.failover:
            print(
                "  failover: each python step gets a second instance and a standby, loading now"
                " (a dying stub then fails only the requests inside it; --no-failover saves"
                " their memory)"
            )
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


def _where(host: str) -> str:
    from merlin_torch_serving.launcher.access import connect_host, is_loopback

    if connect_host(host) != host:
        return f"{host} (every interface: reachable from other machines)"
    return f"{host} (this machine only)" if is_loopback(host) else host


def _print_access(server) -> None:
    from merlin_torch_serving.launcher.access import ADMIN_KEY_ENV_VAR, ADMIN_KEY_HEADER

    apis = server.config.restricted_apis
    if not apis:
        print("  admin APIs: open to every caller (--restricted-apis '')")
        return
    held_in = (
        f"${ADMIN_KEY_ENV_VAR}"
        if os.environ.get(ADMIN_KEY_ENV_VAR)
        else " and ".join(str(path) for path in server.admin_key_files) + " (only you can read it)"
    )
    print(
        f"  admin APIs ({', '.join(apis)}) want the header {ADMIN_KEY_HEADER!r}; its key is in"
        f" {held_in}"
    )


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def infer(args) -> int:
    import pandas as pd

    from merlin_torch_serving.client.schema_client import Client

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


def score(args) -> int:
    from merlin_torch_serving.scoring.dataset import score_dataset

    result = score_dataset(
        args.repository,
        args.input,
        args.output,
        name=args.name,
        client=args.scheduler,
        workers=args.workers,
        columns=args.columns,
        partition_rows=args.partition_rows,
        batch_sessions=args.batch_sessions,
        overwrite=args.overwrite,
        progress=True,
    )
    kept = f", {result.skipped} kept from an earlier run" if result.skipped else ""
    print(
        f"wrote {result.sessions:,} sessions of ensemble {result.ensemble!r} into"
        f" {result.output} ({result.partitions} part files{kept}) in {result.seconds:.1f} s"
    )
    return 0


def models(args) -> int:
    from merlin_torch_serving.client.schema_client import Client

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
        f"bundled {len(result.python_steps)} python step(s) with Python"
        f" {result.environment.python_version} and {len(result.environment.distributions)}"
        f" distributions into {result.path}"
    )
    return 0


def deploy_files(args) -> int:
    from merlin_torch_serving.deployment.deploy_files import DeploySettings, write

    settings = DeploySettings(
        **{
            field.name: getattr(args, field.name)
            for field in deploy_fields()
            if getattr(args, field.name) is not None
        }
    )
    for path in write(args.out, settings):
        print(path)
    return 0


def deploy_fields():
    """DeploySettings' fields: `deploy-files` takes one option per field."""
    import dataclasses

    from merlin_torch_serving.deployment.deploy_files import DeploySettings

    return dataclasses.fields(DeploySettings)


def build_backend(args) -> int:
    from merlin_torch_serving.backends.pytorch_build import (
        build_pytorch_backend,
        built_for_running_torch,
        sources_unavailable,
    )

    if args.check:
        built = built_for_running_torch()
        if built is None:
            print("no pytorch backend is built for this torch and the bundled tritonserver")
            return 1
    elif (
        args.skip_if_unreachable
        and args.sources is None
        and built_for_running_torch() is None
        and (reason := sources_unavailable()) is not None
    ):
        print(
            f"not building the pytorch backend: its sources cannot be cloned: {reason}. Pass"
            " --sources PATH (Triton's pytorch_backend release sources) to build it offline"
        )
        return 0
    else:
        built = build_pytorch_backend(
            sources=args.sources, jobs=args.jobs, progress=lambda line: print(line, flush=True)
        )
    state = "built now" if built.built_now else "already built"
    print(
        f"pytorch backend for torch {built.torch_version} and tritonserver"
        f" {built.tritonserver_version} ({state}): {built.library}"
    )
    return 0


def version_report() -> str:
    """This library's version, the Python it runs on, and the tritonserver `serve` would start."""
    import platform

    from merlin_torch_serving import __version__
    from merlin_torch_serving.backends.bundle import tritonserver_version
    from merlin_torch_serving.launcher.server import find_tritonserver

    try:
        binary = find_tritonserver()
        server = f"tritonserver {tritonserver_version(binary) or '(version unknown)'} at {binary}"
    except MerlinTorchServingError:
        server = "no tritonserver found (pip install 'merlin-torch-serving[server]' bundles one)"
    return f"merlin-torch-serving {__version__} (Python {platform.python_version()}; {server})"


def _print_models(report) -> None:
    """One line per model (``ModelHealth``).

    Each line gives the version, the state, whether its stubs run, and the failed requests.
    """
    if not report:
        print("no models")
        return
    width = max(len(m.name) for m in report)
    print(f"{'MODEL':<{width}}  VERSION  {'STATE':<11}  STUBS  FAILED")
    for m in report:
        stubs = {True: "alive", False: "DEAD", None: "-"}[m.stubs_alive]
        failed = "-" if m.failed_requests is None else str(m.failed_requests)
        line = (
            f"{m.name:<{width}}  {m.version or '-'!s:<7}  {m.state or 'not loaded':<11} "
            f" {stubs:<5}  {failed:<6}"
        )
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
