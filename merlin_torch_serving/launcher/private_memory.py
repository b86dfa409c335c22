"""The python backend's shared memory, readable by the server's own user only.

tritonserver's python backend hands every request and answer to its stubs through regions in
``/dev/shm``. It makes them with boost.interprocess, which opens each region with mode 0644 and
then calls ``fchmod(fd, 0644)`` so that no umask narrows it: any local user could read the
requests. So the launcher starts tritonserver with umask 077 and a seccomp filter under which
``fchmod(fd, 0644)`` changes nothing (and reports success): the regions keep the umask's 0600, and
files tritonserver and its stubs create are their user's alone. Any other mode is set as asked.
Where the kernel takes no seccomp filter (or on an architecture this module does not know) the
server starts as before; ``exposed_regions`` lets the launcher see it and say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import stat
import struct
from collections.abc import Callable
from pathlib import Path

#: the umask tritonserver and its stubs run with
UMASK = 0o077
#: the mode boost.interprocess forces on every shared-memory region it creates
FORCED_MODE = 0o644
SHARED_MEMORY_DIR = Path("/dev/shm")

_PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2  # <linux/seccomp.h>
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000  # with errno 0: the call "succeeds" without effect
_LOAD_WORD, _JUMP_IF_EQUAL, _RETURN = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
#: machine -> (AUDIT_ARCH_*, the fchmod syscall's number)
_FCHMOD = {"x86_64": (0xC000003E, 91), "aarch64": (0xC00000B7, 52)}
# offsets in struct seccomp_data: nr, arch, and the low 32 bits of the second argument
_NR, _ARCH, _SECOND_ARGUMENT = 0, 4, 24


class _Program(ctypes.Structure):
    _fields_ = [("length", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _filter() -> bytes | None:
    """The seccomp program: fchmod(fd, FORCED_MODE) returns 0 and does nothing; every other call
    runs. None on an architecture without a known syscall number."""
    known = _FCHMOD.get(platform.machine())
    if known is None:
        return None
    arch, fchmod = known
    instructions = [
        (_LOAD_WORD, 0, 0, _ARCH),
        (_JUMP_IF_EQUAL, 0, 5, arch),  # another architecture: allow
        (_LOAD_WORD, 0, 0, _NR),
        (_JUMP_IF_EQUAL, 0, 3, fchmod),  # another call: allow
        (_LOAD_WORD, 0, 0, _SECOND_ARGUMENT),
        (_JUMP_IF_EQUAL, 0, 1, FORCED_MODE),  # another mode: allow
        (_RETURN, 0, 0, _SECCOMP_RET_ERRNO),
        (_RETURN, 0, 0, _SECCOMP_RET_ALLOW),
    ]
    return b"".join(struct.pack("HBBI", *instruction) for instruction in instructions)


def restrictor() -> Callable[[], None]:
    """What a child calls between fork and exec to start private (see the module's docstring).

    Everything it needs is made here, before the fork: the child does as little as possible.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    code = _filter()
    buffer = ctypes.create_string_buffer(code) if code else None
    program = _Program(len(code) // 8, ctypes.addressof(buffer)) if code and buffer else None

    def restrict() -> None:
        os.umask(UMASK)
        if program is None or buffer is None:  # (buffer: the program points into it)
            return
        # failures leave the server as it was (see exposed_regions); no new privileges is what an
        # unprivileged process must promise before it may install a filter
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
            libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0)

    return restrict


def exposed_regions(prefix: str) -> list[Path]:
    """The regions named ``<prefix>...`` that users other than their owner may read or write."""
    found = []
    for region in SHARED_MEMORY_DIR.glob(f"{prefix}*"):
        try:
            mode = region.stat().st_mode
        except OSError:
            continue  # removed meanwhile
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            found.append(region)
    return found
