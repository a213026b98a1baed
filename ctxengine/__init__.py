"""ctx-engine: a local GGUF inference engine where a context is an object.

    import ctxengine as ce
    model = ce.load("smollm2")
    c = model.context("main")
    c.append("The capital of France is")
    for piece in c.generate(max_tokens=16, temperature=0.0):
        print(piece.text, end="")
"""
from .errors import CtxError
from .version import __version__

__all__ = ["CtxError", "Model", "Store", "load", "__version__"]


def __getattr__(name: str):
    # Imported on first use, so that `ctxengine.store` and `ctxengine.errors`
    # load without the native core (the store knows no model).
    if name in ("Model", "load"):
        from .state import model

        return getattr(model, name)
    if name == "Store":
        from .store import Store

        return Store
    raise AttributeError(f"module 'ctxengine' has no attribute {name!r}")
