"""Compiling a module ahead of time: ``torch.export`` (non-strict, every wire tensor's first
dimension dynamic), then AOTInductor into a ``.pt2`` package for an instruction set and a thread
count, kept in a cache keyed by what it holds.

A compile takes tens of seconds (about a minute for the session example's XLNet on 2 cores), so
every package is cached by content: the exported graph, its weights, the instruction set and its
CPU features, the thread count and torch's version. Exporting the same step again, or running it
in-process and then exporting it, compiles it once (``$MTS_CACHE_DIR/packages``; delete the folder
to free its space). Export is run with sizes taken as "any size, 0 and 1 included" rather than
specialised on the example's (``backed_size_oblivious``) and with no two dimensions assumed equal
because the example's happen to be (``use_duck_shape`` off).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from merlin_torch_serving.aot import transformers4rec
from merlin_torch_serving.aot.instruction_sets import InstructionSet
from merlin_torch_serving.aot.package import INPUTS_KEY, tensor_signature
from merlin_torch_serving.backends import bundle
from merlin_torch_serving.exceptions import PackageError

logger = logging.getLogger("merlin_torch_serving")
PACKAGES_FOLDER = "packages"
#: how packages are compiled here, in the cache key: change it when that changes
RECIPE = "export-any-size-2"
#: how many lines of torch.export's error a fallback reason quotes
_REASON_LINES = 3


def export_program(
    module: torch.nn.Module,
    example: Mapping[str, torch.Tensor],
    label: str,
    dynamic_dim: int = 0,
) -> torch.export.ExportedProgram:
    """``module`` (``forward(inputs: Dict[str, Tensor])``) exported on ``example`` with each
    tensor's dimension ``dynamic_dim`` dynamic (1 for tensors in the batched wire form, whose first
    is the request's 1); a ``PackageError`` says why torch.export refused it."""
    transformers4rec.allow_export()
    example = dict(example)
    dynamic = ({name: {dynamic_dim: torch.export.Dim.DYNAMIC} for name in example},)
    try:
        with _any_size(), torch.no_grad(), _torch_notices_ignored():
            return torch.export.export(
                module.eval(), (example,), dynamic_shapes=dynamic, strict=False
            )
    except Exception as error:
        raise PackageError(f"{label}: torch.export cannot take it: {reason(error)}") from error


def compiled_package(
    program: torch.export.ExportedProgram,
    example: Mapping[str, torch.Tensor],
    *,
    label: str,
    instruction_set: InstructionSet,
    threads: int | None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """The package of ``program`` for ``instruction_set`` and ``threads`` (None: torch's count
    now) from the cache, compiled into it first when it is not there."""
    threads = threads or torch.get_num_threads()
    folder = Path(cache_dir) if cache_dir is not None else bundle.cache_root() / PACKAGES_FOLDER
    target = folder / f"{package_key(program, instruction_set, threads)}.pt2"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    # a warning, so that the pause it announces is explained where no logging is configured
    logger.warning(
        "%s: compiling ahead of time with AOTInductor for %s, %d thread(s) (about a minute on"
        " 2 cores; the package is cached)",
        label,
        instruction_set.description,
        threads,
    )
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=".compiling-", dir=folder))
    configs = {
        "aot_inductor.metadata": {
            **instruction_set.metadata(),
            INPUTS_KEY: tensor_signature(example),
        },
        "cpp.threads": threads,
        **instruction_set.inductor_configs(),
    }
    try:
        # compiled as exported: sizes may be 0 or 1 (Inductor otherwise assumes 2 or more of every
        # dynamic size, and a request of one click would fail a check it adds)
        with _any_size(), torch.no_grad(), _torch_notices_ignored():
            built = torch._inductor.aoti_compile_and_package(
                program, package_path=str(staging / "model.pt2"), inductor_configs=configs
            )
        os.replace(built, target)
    except Exception as error:
        raise PackageError(f"{label}: AOTInductor could not compile it: {reason(error)}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("%s: compiled in %.0f s into %s", label, time.monotonic() - started, target)
    return target


def package_key(
    program: torch.export.ExportedProgram, instruction_set: InstructionSet, threads: int
) -> str:
    """What a package holds, as a hash: graph, weights, instruction set, threads, torch."""
    digest = hashlib.sha256()
    for part in (
        RECIPE,
        torch.__version__,
        instruction_set.name,
        " ".join(instruction_set.required_flags),
        str(threads),
        str(program.graph),
        str(program.range_constraints),
        str(program.call_spec),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    tensors = {**program.state_dict, **program.constants}
    for name in sorted(tensors):
        value = tensors[name]
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            digest.update(f"{value.dtype}{list(value.shape)}".encode())
            raw = value.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
            digest.update(raw.numpy().tobytes())
        else:  # a script object: its repr is all there is to compare
            digest.update(repr(value).encode())
    return digest.hexdigest()[:32]


@contextlib.contextmanager
def _torch_notices_ignored():
    """torch's own deprecation notices about its internals (its pytree specs, while it packages),
    which say nothing to a user of this library, left out; and its notice that a module assigned
    tensor attributes while it was exported: Transformers4Rec's modules keep the tensors of the
    current call in attributes (its masking's targets), set and read within that call, which the
    exported graph computes as it should."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings(
            "ignore",
            message="The tensor attributes .* were assigned during export",
            category=UserWarning,
        )
        yield


def _any_size():
    """Sizes taken as any size, 0 and 1 included, and no two assumed equal because they happen to
    be in the example."""
    from torch.fx.experimental import _config as shapes_config

    return shapes_config.patch(  # type: ignore[attr-defined]  # installed on the module
        backed_size_oblivious=True, use_duck_shape=False
    )


def reason(error: BaseException) -> str:
    """The first lines of an error, for a fallback's logged and recorded reason."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = "; ".join(lines[:_REASON_LINES]) or type(error).__name__
    return f"{type(error).__name__}: {text if len(text) <= 400 else text[:397] + '...'}"
