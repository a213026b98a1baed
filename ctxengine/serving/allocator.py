"""The C allocator of a long-running server (glibc's malloc).

A generation allocates large, short-lived buffers (a prefill's logits are
``rows x n_vocab`` float32: 196 KB a row for SmolLM2, megabytes a prompt).
glibc serves blocks above its mmap threshold with mmap and gives them back
to the system when freed, but by default it *raises* that threshold to the
size of each such block freed (up to 32 MiB), after which blocks that size
come from the heap arenas of whichever thread asked, and fragmentation there
keeps them: a server's anonymous memory creeps up with the requests it has
served (bench/soak.py). Pinning the threshold at its default turns the
dynamic adjustment off, so those buffers are mapped and unmapped each time.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3          # glibc's mallopt() parameter
MMAP_THRESHOLD = 128 * 1024    # glibc's default, pinned


def pin_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold (a no-op elsewhere); whether it was pinned."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): nothing to pin
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
