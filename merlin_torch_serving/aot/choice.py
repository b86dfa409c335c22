"""What a libtorch step is asked to be: ``"auto"`` (an AOTInductor package where torch.export takes
its operators, else TorchScript), ``"package"`` or ``"torchscript"``; ``compiled=None`` takes the
process's default from ``$MTS_COMPILED`` ("auto" when unset), so a test suite or a machine
without a C++ compiler can keep TorchScript everywhere without changing the code."""

from __future__ import annotations

import os

CHOICES = ("auto", "package", "torchscript")
ENV_VAR = "MTS_COMPILED"


def compiled_choice(value: str | None) -> str:
    """``value``, else the process's default; a ``ValueError`` names the choices."""
    chosen = value if value is not None else os.environ.get(ENV_VAR) or "auto"
    if chosen not in CHOICES:
        source = "compiled" if value is not None else f"${ENV_VAR}"
        listed = ", ".join(map(repr, CHOICES))
        raise ValueError(f"{source} must be one of {listed}, got {chosen!r}")
    return chosen
