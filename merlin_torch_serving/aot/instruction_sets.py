"""The CPU instruction set a package is compiled for, what it records of it, and the check that
refuses to run a package on a CPU without the features its code needs.

AOTInductor compiles a package's kernels with ``-march=native`` and the widest vector instructions
of the CPU it runs on: on another CPU such a package dies of an illegal instruction on its first
request. So every package records the CPU features its code may use (metadata
``required_cpu_flags``, named as ``/proc/cpuinfo`` names them) and a description
(``instruction_set``); Triton's pytorch backend as this project builds it, and this process,
refuse to load it where one is missing, naming them and the fix. ``"native"`` (the default) is
this CPU; the x86-64 micro-architecture levels compile for every CPU of that level (``-march``
and Inductor's vector width set to match): ``"x86-64-v3"`` (AVX2, FMA: x86 server CPUs since
2013-2015) is the usual portable choice, ``"x86-64"`` runs anywhere, without vector kernels.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

from merlin_torch_serving.exceptions import PackageError

#: the package metadata keys (read by the changed pytorch backend too)
REQUIRED_FLAGS_KEY = "required_cpu_flags"
DESCRIPTION_KEY = "instruction_set"
NATIVE = "native"

# x86-64 micro-architecture levels (the psABI's), as /proc/cpuinfo names their features
_X86_64 = ("cmov", "cx8", "fpu", "fxsr", "mmx", "sse", "sse2")
_V2 = (*_X86_64, "cx16", "lahf_lm", "pni", "popcnt", "sse4_1", "sse4_2", "ssse3")
_V3 = (*_V2, "abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave")
_V4 = (*_V3, "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")
#: level -> (its features, Inductor's vector width in bits: 0 for scalar kernels)
LEVELS = {
    "x86-64-v4": (_V4, 512),
    "x86-64-v3": (_V3, 256),
    "x86-64-v2": (_V2, 0),
    "x86-64": (_X86_64, 0),
}
INSTRUCTION_SETS = (NATIVE, *LEVELS)

# the features a compiler targeting this CPU (-march=native) may emit instructions of; the CPU's
# other flags (its cache, its hypervisor) say nothing about the code
_EXTENSIONS = frozenset(
    {
        *_V4,
        "sse4a", "fma4", "xop", "aes", "pclmulqdq", "sha_ni", "adx", "rdrand", "rdseed",
        "xsaveopt", "xsavec", "xsaves", "fsgsbase", "clflushopt", "clwb", "gfni", "vaes",
        "vpclmulqdq", "avx_vnni", "avx_vnni_int8", "avx_ifma", "avx512ifma", "avx512vbmi",
        "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16",
        "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "movdiri", "movdir64b",
        "serialize", "rdpid", "cldemote", "tsxldtrk", "prefetchw", "3dnowprefetch", "wbnoinvd",
    }
)  # fmt: skip


@dataclass(frozen=True)
class InstructionSet:
    """What a package is compiled for: ``name`` (one of ``INSTRUCTION_SETS``), the CPU features its
    code may use, and how it reads in messages."""

    name: str
    required_flags: tuple[str, ...]
    description: str
    #: Inductor's ``cpp.march`` (None: this CPU) and ``cpp.simdlen`` (None: this CPU's widest)
    march: str | None = None
    simdlen: int | None = None

    def inductor_configs(self) -> dict:
        configs: dict = {}
        if self.march is not None:
            configs["cpp.march"] = self.march
        if self.simdlen is not None:
            configs["cpp.simdlen"] = self.simdlen
        return configs

    def metadata(self) -> dict[str, str]:
        return {
            REQUIRED_FLAGS_KEY: " ".join(self.required_flags),
            DESCRIPTION_KEY: self.description,
        }


def instruction_set(name: str = NATIVE) -> InstructionSet:
    """The instruction set of that name on this machine (``"native"``: this CPU's)."""
    if name not in INSTRUCTION_SETS:
        raise ValueError(
            f"instruction_set must be one of {', '.join(map(repr, INSTRUCTION_SETS))}, got {name!r}"
        )
    if name == NATIVE:
        flags = cpu_flags()
        used = tuple(sorted(flags & _EXTENSIONS)) if flags is not None else ()
        return InstructionSet(NATIVE, used, f"native ({_cpu_model()})")
    if platform.machine() not in ("x86_64", "AMD64"):
        raise ValueError(
            f"instruction_set {name!r} is an x86-64 level; this machine is {platform.machine()}:"
            " compile for 'native'"
        )
    features, width = LEVELS[name]
    return InstructionSet(name, features, name, march=name, simdlen=width)


def check_cpu(metadata: dict[str, str], package: str | Path, label: str) -> None:
    """Refuse a package (``PackageError``) whose code needs CPU features this CPU lacks."""
    flags = cpu_flags()
    required = metadata.get(REQUIRED_FLAGS_KEY)
    if flags is None or required is None:
        return  # not Linux, or a package compiled elsewhere: nothing to check against
    missing = [flag for flag in required.split() if flag not in flags]
    if missing:
        raise PackageError(
            f"{label}: the package {str(package)!r} was compiled for the instruction set"
            f" {metadata.get(DESCRIPTION_KEY, 'unrecorded')} and needs the CPU feature(s)"
            f" {', '.join(missing)}, which this CPU lacks; export it again for an instruction set"
            " this CPU has (ModelOptions(instruction_set='x86-64-v3'), or 'x86-64' for any x86-64"
            " CPU), or run it on a CPU that has them"
        )


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags (``flags`` of /proc/cpuinfo), or None where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
