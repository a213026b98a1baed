"""What a served model's file says about it, read once per file version: the
facts Ollama's ``/api/tags``, ``/api/ps`` and ``/api/show`` report
(ollama/model_info.py) and the chat template it is shown with. The faces
never open a GGUF file themselves. A packaged model not assembled yet
(gemma3, on a fresh CTX_HOME) is listed without its file's facts and
assembled when it is shown, as a request for it assembles it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.gguf_file import open_gguf
from ..engine.registry import MODELS, resolve_model
from ..engine.weights import cached_weight_id
from ..errors import ModelNotFoundError
from ..ollama.model_info import details as ollama_details, model_info

if TYPE_CHECKING:
    from ..engine.model_source import CatalogEntry

_NO_FILE = {"format": "gguf", "family": "", "families": None, "parameter_size": "", "quantization_level": ""}
_FACTS: dict[tuple, tuple[dict, dict]] = {}  # (name, path, size, mtime) -> (details, model_info)


def digest(entry: "CatalogEntry") -> str:
    """The manifest's sha256 for an Ollama model (as Ollama shows it), else the weight id."""
    if entry.digest or entry.path is None:
        return entry.digest
    try:
        return cached_weight_id(entry.path)
    except Exception:  # noqa: BLE001 - an unreadable file: listed, with no digest
        return ""


def details(entry: "CatalogEntry") -> dict:
    """Ollama's ``details`` of a model; a broken file's carry its ``error``. A packaged
    model not assembled yet has none to read: a listing never writes its hundreds of MB."""
    if entry.path is None or _to_assemble(entry):
        return dict(_NO_FILE)
    try:
        return facts(entry)[0]
    except Exception as err:  # noqa: BLE001 - a broken file is listed with the reason, not crashed on
        return {**_NO_FILE, "error": str(err)}


def facts(entry: "CatalogEntry", *, verbose: bool = False) -> tuple[dict, dict]:
    """(details, model_info) of an entry's GGUF file, read once per file version (a packaged
    model is assembled first, as its first load would). ``verbose``: model_info's arrays
    in full, read each time rather than kept (a vocabulary is hundreds of thousands of strings)."""
    path = _file(entry)
    try:
        stat = path.stat()
    except OSError as err:  # deleted since it was listed
        raise ModelNotFoundError(f"model '{entry.name}': its file {path} is gone ({err.strerror})") from None
    key = (entry.name, str(path), stat.st_size, stat.st_mtime_ns)
    if verbose or key not in _FACTS:
        with open_gguf(str(path)) as f:
            found = (ollama_details(entry, f), model_info(f, verbose=verbose))
        if verbose:
            return found
        _FACTS[key] = found
    return _FACTS[key]


def chat_template(entry: "CatalogEntry") -> str:
    """The template a model is shown with: its Go template layer, else the GGUF's own."""
    if entry.template is not None:
        return entry.template
    with open_gguf(_file(entry)) as f:
        return f.get("tokenizer.chat_template") or ""


def _to_assemble(entry: "CatalogEntry") -> bool:
    """Whether an entry is a packaged model that is servable but not built yet: its file is
    made from an installed package on first use (engine/registry.py), as gemma3's is."""
    return entry.source == "packaged" and entry.path is not None and not entry.path.is_file() and any(
        known.name == entry.name and known.make is not None and known.installed() for known in MODELS)


def _file(entry: "CatalogEntry") -> Path:
    """The entry's GGUF file, a packaged model's assembled now if it is not yet."""
    return resolve_model(entry.name) if _to_assemble(entry) else entry.path
