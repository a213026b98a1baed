"""Ollama's options (a request's ``options``, a Modelfile's PARAMETER lines, a
model's params layer): the names Ollama knows and the JSON type each takes, as
its ``api.Options`` declares them. What each does here is the HTTP face's
business (api/options.py); what a stored model's params layer may hold is the
store's (store.py checks it when the model is listed, so a model whose
defaults could never apply is listed as one that cannot be served).
"""
from __future__ import annotations

import math
import numbers

# Options that set a SamplerParams field of the same name.
SAMPLER = {"temperature": "float", "top_k": "int", "top_p": "float", "min_p": "float",
           "repeat_penalty": "float", "repeat_last_n": "int", "presence_penalty": "float",
           "frequency_penalty": "float"}
# Options read by the serving of a request itself.
REQUEST = {"seed": "int", "num_predict": "int", "num_ctx": "int", "stop": "str_list"}
# Options Ollama knows that have no effect here (GPU placement, mirostat, ...): type-checked only.
NO_EFFECT = {"num_keep": "int", "typical_p": "float", "tfs_z": "float", "mirostat": "int",
             "mirostat_tau": "float", "mirostat_eta": "float", "penalize_newline": "bool", "numa": "bool",
             "num_batch": "int", "num_gpu": "int", "main_gpu": "int", "low_vram": "bool", "f16_kv": "bool",
             "logits_all": "bool", "vocab_only": "bool", "use_mmap": "bool", "use_mlock": "bool",
             "embedding_only": "bool", "num_thread": "int"}
KINDS = {**SAMPLER, **REQUEST, **NO_EFFECT}
_WANTED = {"int": "an integer", "float": "a finite number", "bool": "true or false",
           "str_list": "a list of strings or a string"}


def fits(kind: str, value: object) -> bool:
    """Whether ``value`` (parsed JSON) is of an option kind (an int sent as 64.0 counts)."""
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "float":
        try:
            return isinstance(value, numbers.Real) and math.isfinite(value)
        except OverflowError:  # an integer too large for a float: no finite number here either
            return False
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def params_problem(params: dict) -> str | None:
    """What makes a params layer unusable (an option of the wrong type), or None.
    Unknown names are ignored, as Ollama ignores them."""
    for name, value in params.items():
        kind = KINDS.get(name)
        if kind is not None and not fits(kind, value):
            return f"the params layer's '{name}' must be {_WANTED[kind]}, not {value!r}"[:300]
        if name == "num_ctx" and value < 1:
            return f"the params layer's 'num_ctx' must be >= 1, not {value!r}"
    return None
