"""Where a model name that is neither a path nor a packaged model is looked up.

``MODEL_SOURCES`` lists the model sources (engine/model_source.py) in the
order they are asked: ``ce.load`` passes them to the registry, and the served
catalog (serving/catalog.py) to the catalog. Kept apart from state/model.py,
which imports the whole runtime, so that a catalog scan (``ctx models list``)
imports only the stores it reads.
"""
from __future__ import annotations

from .ollama.store import OllamaSource

MODEL_SOURCES = (OllamaSource(),)
