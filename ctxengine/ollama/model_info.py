"""What Ollama's ``/api/show`` says about a model: ``model_info`` and ``details``.

Follows ollama/ollama ``server/routes.go`` GetModelInfo and ``fs/ggml``:

* ``model_info`` is the GGUF's metadata, less ``general.name`` and
  ``tokenizer.chat_template``, with ``general.parameter_count`` set to the
  sum of every tensor's element count (Ollama recomputes it even when the
  file has one).  Unless ``verbose``, every non-empty array (the vocabulary,
  merges, token types, even a one-element ``general.languages``) is null: Ollama
  decodes arrays with a size limit of 0 and marshals the skipped ones as null.
* ``details`` comes from the manifest's config blob when there is one
  (``model_format``, ``model_family``, ``model_families``, ``model_type``,
  ``file_type``), else from the GGUF, as ``ollama create`` would have
  written it: ``parameter_size`` is format.HumanNumber of the parameter count
  (SmolLM2-135M: "134.52M") and ``quantization_level`` the name of
  ``general.file_type`` (llama.cpp's llama_ftype: 3 is "Q4_1").
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine.gguf_file import GGUFFile

if TYPE_CHECKING:
    from ..engine.model_source import CatalogEntry

# fs/ggml/type.go FileType.String(): llama_ftype id -> name (4-6 were removed from GGUF).
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}
HIDDEN_KEYS = ("general.name", "tokenizer.chat_template")


def parameter_count(f: GGUFFile) -> int:
    return sum(math.prod(t.shape) for t in f.tensors.values())


def parameter_size_text(n: int) -> str:
    """format/format.go HumanNumber: 134515008 -> "134.52M", 7e9 -> "7B", 1500 -> "2K"."""
    if n >= 10**9:
        x = n / 10**9
        return f"{x:.0f}B" if x == math.floor(x) else f"{x:.1f}B"
    if n >= 10**6:
        x = n / 10**6
        return f"{x:.0f}M" if x == math.floor(x) else f"{x:.2f}M"
    if n >= 1000:
        return f"{n / 1000:.0f}K"
    return str(n)


def file_type_name(value: Any) -> str:
    """The quantization_level Ollama shows for general.file_type ("unknown" if absent)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return "unknown"
    return FILE_TYPES.get(int(value), "unknown")


def _plain(value: Any) -> Any:
    """A JSON-ready copy; float32 values get their float32 spelling (1e-05, not 9.99999974e-06)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            return None  # JSON has no NaN or infinity
        single = float(str(np.float32(v)))
        return single if float(np.float32(single)) == v else v
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    return value


def model_info(f: GGUFFile, *, verbose: bool = False) -> dict[str, Any]:
    """/api/show's model_info for an open GGUF file (JSON-serialisable)."""
    out: dict[str, Any] = {}
    for key, value in f.metadata.items():
        if key in HIDDEN_KEYS:
            continue
        if isinstance(value, (list, tuple, np.ndarray)) and len(value) and not verbose:
            out[key] = None
        else:
            out[key] = _plain(value)
    out["general.parameter_count"] = parameter_count(f)
    return out


def details(entry: "CatalogEntry | None", f: GGUFFile) -> dict[str, Any]:
    """/api/show's and /api/tags' details (validates as ollama's ModelDetails)."""
    config = entry.config if entry is not None else {}
    quant = config.get("file_type") or ""
    if quant in ("", "unknown"):
        quant = file_type_name(f.get("general.file_type"))
    return {
        "parent_model": entry.parent_model if entry is not None else "",
        "format": config.get("model_format") or "gguf",
        "family": config.get("model_family") or f.arch,
        "families": list(config.get("model_families") or [f.arch]),
        "parameter_size": config.get("model_type") or parameter_size_text(parameter_count(f)),
        "quantization_level": quant,
    }
