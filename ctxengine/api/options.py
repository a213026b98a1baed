"""Sampling settings as every dialect states them, onto one :class:`Sampling`.

Each dialect reads its own field names into a Sampling; an entry's Ollama
params layer (Ollama option names, like ``"temperature"`` or ``"stop"``) is
read by the same table as Ollama's request ``options``, and gives the
defaults a request's own values override. What no one sets is the engine's
default (SamplerParams: llama.cpp's). :class:`Sampling` itself is serving's
(serving/generate.py): a request's settings, whatever dialect stated them.

Ollama options: the ones that map are honoured; the others Ollama knows are
type-checked and have no effect here (GPU placement, mirostat, ...); unknown
names are ignored, as Ollama ignores them.
"""
from __future__ import annotations

from ..serving.exports import OLLAMA_NO_EFFECT, OLLAMA_SAMPLER
from ..serving.generate import Sampling
from .errors import ApiError
from .fields import Fields

__all__ = ["Sampling", "entry_sampling", "ollama_sampling", "seed"]


def ollama_sampling(options: dict, where: str = "options.") -> Sampling:
    """Ollama options (a request's, or a params layer's) as Sampling."""
    f = Fields(options, where)
    out = Sampling()
    for name, kind in OLLAMA_SAMPLER.items():
        if name in f:
            out.params[name] = getattr(f, kind)(name)
    for name, kind in OLLAMA_NO_EFFECT.items():
        if name in f:
            getattr(f, kind)(name)
    if "seed" in f:
        seed = f.int("seed")
        if seed >= 0:  # Ollama: a negative seed means a random one
            out.params["seed"] = seed
    if "num_predict" in f:
        n = f.int("num_predict")
        out.max_tokens = n if n >= 0 else None  # -1: no limit, -2: fill the context
    if "num_ctx" in f:
        out.num_ctx = f.int("num_ctx", min=1)
    if "stop" in f:
        out.stop = f.str_list("stop")
    return out


def entry_sampling(entry) -> Sampling:
    """The defaults an entry's params layer sets (none for plain GGUF files)."""
    if not entry.params:
        return Sampling()
    try:
        return ollama_sampling(entry.params, where=f"{entry.name} params layer: ")
    except ApiError as err:
        raise ApiError(500, f"model '{entry.name}' has an unusable params layer: {err.message}") from None


def context_length(entry, n_ctx: int, num_ctx: int | None = None) -> int:
    """The context a request on an entry gets: ``num_ctx`` (the request's, else its params
    layer's), within the model's n_ctx; ApiError for an unusable params layer."""
    num_ctx = num_ctx or entry_sampling(entry).num_ctx
    return min(n_ctx, num_ctx) if num_ctx else n_ctx


def seed(f: Fields) -> int:
    """OpenAI's ``seed``, a signed 64-bit integer, as the engine's unsigned one (two's complement);
    seeds up to 2**64 - 1 are taken as they always were."""
    value = f.int("seed")
    if not -(1 << 63) <= value < 1 << 64:
        raise ApiError(400, f"'seed' must be a 64-bit integer, got {value}", param="seed")
    return value % (1 << 64)
