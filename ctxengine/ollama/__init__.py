"""Ollama's model store, read in place, and its Go-template prompt renderer
(docs/ollama-store.md).

    store.py          manifests and blobs -> catalog entries; names as Ollama parses them
    template.py       an Ollama template layer rendered for a conversation
    go_template_*.py  the text/template subset those layers use (parse, values, exec)
    model_info.py     what /api/show says about a model

Importing this package registers Ollama's store as a model source
(engine/model_source.py), so ``ce.load("smollm2:135m")`` and the catalog
find Ollama's models while the engine never imports this package.
"""
from ..engine.model_source import register_source
from .store import OllamaSource

register_source(OllamaSource())
