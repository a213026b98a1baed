"""Errors of writing downloads to disk, worded by why: a full disk, a folder
we may not write. Used by both pulls (engine/hf_pull.py, ollama/registry_pull.py)."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from ..errors import CtxError


def storage_error(err: OSError, folder: Path) -> CtxError:
    """A write that failed, worded by why: a full disk or a folder we may not write."""
    if err.errno == errno.ENOSPC:
        free = shutil.disk_usage(folder).free if folder.exists() else 0
        return CtxError(f"disk full: no space left in {folder} ({free} bytes free); "
                        "free some space and run the pull again (it resumes)")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CtxError(f"permission denied: cannot write into {folder} ({err.strerror})")
    return CtxError(f"cannot write into {folder}: {err}")


def check_free_space(folder: Path, needed: int) -> None:
    """Refuse up front a pull that cannot fit, naming both numbers."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free and probe.is_dir() and not os.access(probe, os.W_OK):  # read-only: say that first
        raise storage_error(OSError(errno.EACCES, "not writable"), probe)
    if needed > free:
        raise CtxError(f"disk full: the pull needs {needed} more bytes, {probe} has {free} free")
