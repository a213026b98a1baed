"""ctx-engine: a local GGUF inference engine where a context is an object.

    import ctxengine as ce
    model = ce.load("smollm2")
    c = model.context("main")
    c.append("The capital of France is")
    for piece in c.generate(max_tokens=16, temperature=0.0):
        print(piece.text, end="")
"""
from .errors import CtxError
from .model import Model, load

__version__ = "0.1.0"
__all__ = ["CtxError", "Model", "load", "__version__"]
