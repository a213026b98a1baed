"""Whether the engine can run a GGUF file, from its header, remembered per file version.

Apart from the catalog (engine/catalog.py) so that what only needs this answer (a
pull deciding whether to record what it fetched) does not import the registry.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import CtxError
from .gguf_file import open_gguf

# (why not, architecture) by the file's identity (a served catalog is built again often)
_facts: dict[tuple, tuple[str | None, str | None]] = {}
_adapter_reasons: dict[tuple, str | None] = {}  # by the adapter's and the model's identities


def _identity(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def unservable_reason(path: Path) -> str | None:
    """Why the engine cannot run this GGUF file (a split model: its first part), or None.
    Remembered while the file is the same (device, inode, size, mtime): reading a header
    walks the whole vocabulary, tens of milliseconds a model."""
    return _model_facts(path)[0]


def _model_facts(path: Path) -> tuple[str | None, str | None]:
    """(unservable_reason, its architecture or None where the header cannot be read), remembered."""
    from .config import unsupported_reason  # loads the native core: only when a file is looked at

    key = _identity(path)
    if key is not None and key in _facts:
        return _facts[key]
    arch = None
    try:
        with open_gguf(path, header_only=True) as f:
            arch = f.arch
            why = unsupported_reason(f)
    except CtxError as err:
        why = str(err)
    except (ArithmeticError, LookupError, TypeError, ValueError) as err:
        # Any other error is a bug in the checks (config.py), but one odd file must still
        # be listed as unservable, not take the listing of every other model down with it.
        why = f"{path.name}: cannot read its header: {type(err).__name__}: {err}"
    if key is not None:
        _facts[key] = (why, arch)
    return why, arch


def adapter_reason(adapter: Path, model: Path) -> str | None:
    """Why ``adapter`` cannot be a LoRA adapter of the model in ``model``, from its header
    and the model's architecture (the matrices' shapes are checked when it is loaded), or
    None. Remembered while both files are the same."""
    key = (_identity(adapter), _identity(model))
    if None not in key and key in _adapter_reasons:
        return _adapter_reasons[key]
    try:
        with open_gguf(adapter, header_only=True) as f:
            kind, lora, arch = f.get("general.type"), f.get("adapter.type"), f.arch
        model_arch = _model_facts(model)[1]  # the listing read the model's header already
        if kind != "adapter" or lora != "lora":
            why = f"{adapter.name}: not a LoRA adapter (general.type {kind!r}, adapter.type {lora!r})"
        elif arch != model_arch:
            why = f"{adapter.name}: an adapter for architecture {arch!r}, and the model is {model_arch!r}"
        else:
            why = None
    except CtxError as err:
        why = str(err)
    if None not in key:
        _adapter_reasons[key] = why
    return why
