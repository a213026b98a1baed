"""What a served model's file says about it, read once per file version: the
facts Ollama's ``/api/tags``, ``/api/ps`` and ``/api/show`` report
(ollama/model_info.py) and the chat template it is shown with. The faces
never open a GGUF file themselves.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.gguf_file import open_gguf
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
    """Ollama's ``details`` of a model; a broken file's carry its ``error``."""
    if entry.path is None:
        return dict(_NO_FILE)
    try:
        return facts(entry)[0]
    except Exception as err:  # noqa: BLE001 - a broken file is listed with the reason, not crashed on
        return {**_NO_FILE, "error": str(err)}


def facts(entry: "CatalogEntry") -> tuple[dict, dict]:
    """(details, model_info) of an entry's GGUF file, read once per file version."""
    try:
        stat = entry.path.stat()
    except OSError as err:  # deleted since it was listed
        raise ModelNotFoundError(f"model '{entry.name}': its file {entry.path} is gone ({err.strerror})") from None
    key = (entry.name, str(entry.path), stat.st_size, stat.st_mtime_ns)
    if key not in _FACTS:
        with open_gguf(str(entry.path)) as f:
            _FACTS[key] = (ollama_details(entry, f), model_info(f))
    return _FACTS[key]


def chat_template(entry: "CatalogEntry") -> str:
    """The template a model is shown with: its Go template layer, else the GGUF's own."""
    if entry.template is not None:
        return entry.template
    with open_gguf(entry.path) as f:
        return f.get("tokenizer.chat_template") or ""
