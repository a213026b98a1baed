"""Ollama's model store, read in place, and its Go-template prompt renderer
(docs/ollama-store.md).

    store.py          manifests and blobs -> catalog entries; names as Ollama parses them;
                      OllamaSource, the store as a model source (engine/model_source.py)
    template.py       an Ollama template layer rendered for a conversation
    go_template_*.py  the text/template subset those layers use (parse, values, exec)
    model_info.py     what /api/show says about a model

Importing this package does nothing else: state/model.py lists
``OllamaSource()`` in ``MODEL_SOURCES``, which ``ce.load`` and the served
catalog (serving/catalog.py) pass to the registry and the catalog, so those
never import this package.
"""
