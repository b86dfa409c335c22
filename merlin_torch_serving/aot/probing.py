"""A package called on probe inputs in a child process (``python -m merlin_torch_serving.aot.
probing``): compiled code that divides by zero or reads outside memory on some input kills the
process that runs it, which must be neither the user's nor, once served, the server. A package that
does so on a probe is refused, naming the probe, and never used.

The probes and the answers travel as ``.npz`` files in a temporary folder, one per probe, written
as each probe is answered: a probe without an answer is the one the package died on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from merlin_torch_serving.exceptions import PackageError

#: how long the child may take for all the probes of one package
TIMEOUT_S = 900.0


def package_answers(
    package: Path, label: str, probes: list[dict[str, np.ndarray]], threads: int | None
) -> list[list[np.ndarray] | str]:
    """Per probe, the package's outputs or the error it raised, from a child process; a
    ``PackageError`` names the probe it died on."""
    with tempfile.TemporaryDirectory(prefix="mts-probes-") as scratch:
        folder = Path(scratch)
        for index, probe in enumerate(probes):
            np.savez(folder / f"probe-{index}.npz", **probe)
        command = [
            sys.executable,
            "-m",
            "merlin_torch_serving.aot.probing",
            str(package),
            str(folder),
            str(len(probes)),
            str(threads or 0),
        ]
        try:
            finished = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                # the package's loader unpacks it under $TMPDIR, which a killed child leaves behind
                env={**os.environ, "TMPDIR": scratch},
            )
        except subprocess.TimeoutExpired as error:
            raise PackageError(
                f"{label}: its package did not answer its {len(probes)} probes within"
                f" {TIMEOUT_S:.0f} s"
            ) from error
        answers: list[list[np.ndarray] | str] = []
        for index, probe in enumerate(probes):
            answered, failed = folder / f"answer-{index}.npz", folder / f"error-{index}.txt"
            if answered.is_file():
                with np.load(answered) as outputs:
                    answers.append([outputs[str(i)] for i in range(len(outputs.files))])
            elif failed.is_file():
                answers.append(failed.read_text())
            else:
                sizes = {name: list(array.shape) for name, array in probe.items()}
                tail = finished.stderr.strip().splitlines()[-3:]
                raise PackageError(
                    f"{label}: its package killed the process running it (exit code"
                    f" {finished.returncode}) on a probe of the shapes {sizes}; it is not used."
                    f" Its last words: {' / '.join(tail) or 'none'}"
                )
        return answers


def main(argv: list[str]) -> int:
    from merlin_torch_serving.aot.package import CompiledPackage

    package_path, folder, count, threads = argv
    if int(threads):
        torch.set_num_threads(int(threads))
    package = CompiledPackage(package_path, "probe")
    for index in range(int(count)):
        with np.load(Path(folder) / f"probe-{index}.npz") as probe:
            inputs = {name: torch.from_numpy(np.ascontiguousarray(probe[name])) for name in probe}
        try:
            outputs = package(inputs)
        except Exception as error:  # a refusal: the caller compares it with the eager one's
            (Path(folder) / f"error-{index}.txt").write_text(f"{type(error).__name__}: {error}")
            continue
        written = Path(folder) / f".answer-{index}.npz"
        np.savez(written, **{str(i): output.numpy() for i, output in enumerate(outputs)})
        os.replace(written, Path(folder) / f"answer-{index}.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
