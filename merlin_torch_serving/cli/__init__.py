"""The ``merlin-torch-serving`` command: thin wrappers over TritonServer and Client.

merlin-torch-serving serve REPOSITORY [-- TRITONSERVER ARGS]
                                           run tritonserver in the foreground (Ctrl-C stops it)
merlin-torch-serving infer MODEL FILE      send a parquet/CSV file of rows, print the answer
merlin-torch-serving models                what the server has loaded, and whether it answers
merlin-torch-serving score REPOSITORY INPUT OUTPUT
                                           score a dataset with an export on a Dask cluster
merlin-torch-serving bundle REPOSITORY OUT  a copy for servers whose Python lacks this library
merlin-torch-serving deploy-files OUT      a Dockerfile, Kubernetes and KServe manifests
merlin-torch-serving build-backend pytorch [--sources PATH]
                                           build Triton's libtorch backend for this torch
merlin-torch-serving sessions forget|show --store STORE SESSION...
                                           erase (or count) what a store keeps of sessions
merlin-torch-serving rules block|unblock|show --store STORE [--list NAME] [ITEM...]
                                           change the block lists graphs read while serving
merlin-torch-serving evaluate LOG --clicks CLICKS
                                           read out an answer log: per variant, per branch
"""

from __future__ import annotations

import sys

from merlin_torch_serving.cli.arguments import build_parser, default_url
from merlin_torch_serving.exceptions import MerlinTorchServingError, ServerError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after the first "--" goes to tritonserver unchanged
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - 1] if "--" in argv else argv)
    if extra and args.command != "serve":
        parser.error(
            f"only `serve` passes arguments after '--' on (to tritonserver); got {extra!r}"
        )
    args.tritonserver_args = extra
    default_url(args)
    try:
        return args.run(args)
    except MerlinTorchServingError as error:
        print(f"error: {_without_log(error, args.verbose)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _without_log(error: MerlinTorchServingError, verbose: bool) -> str:
    """The error's message, and tritonserver's log tail only with --verbose.

    The message's first line says what to do.
    """
    if isinstance(error, ServerError) and error.log_tail and not verbose:
        return f"{error.summary}\n(--verbose shows the last lines of tritonserver's log)"
    return str(error)
