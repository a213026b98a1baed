"""Whether the engine can run a GGUF file, from its header, remembered per file version.

Apart from the catalog (engine/catalog.py) so that what only needs this answer (a
pull deciding whether to record what it fetched) does not import the registry.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import CtxError
from .gguf_file import open_gguf

_reasons: dict[tuple, str | None] = {}  # by the file's identity (a served catalog is built again often)


def unservable_reason(path: Path) -> str | None:
    """Why the engine cannot run this GGUF file (a split model: its first part), or None.
    Remembered while the file is the same (device, inode, size, mtime): reading a header
    walks the whole vocabulary, tens of milliseconds a model."""
    from .config import unsupported_reason  # loads the native core: only when a file is looked at

    try:
        st = path.stat()
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and key in _reasons:
        return _reasons[key]
    try:
        with open_gguf(path, header_only=True) as f:
            why = unsupported_reason(f)
    except CtxError as err:
        why = str(err)
    except (ArithmeticError, LookupError, TypeError, ValueError) as err:
        # Any other error is a bug in the checks (config.py), but one odd file must still
        # be listed as unservable, not take the listing of every other model down with it.
        why = f"{path.name}: cannot read its header: {type(err).__name__}: {err}"
    if key is not None:
        _reasons[key] = why
    return why
