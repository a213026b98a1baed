"""The public model object: what ``ctxengine.load`` returns.

It joins the engine (weights, tokenizer, forward) to the live context table,
so that ``model.context("main")`` reads as DESIGN.md shows.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..engine import registry
from ..engine.engine import Engine, LogProbs
from ..engine.lora import LoraAdapter, LoraSet
from ..engine.speculative import check_same_vocabulary
from ..errors import CtxError, RequestError
from ..sources import MODEL_SOURCES
from .context import Context
from .table import ContextTable

LoraScales = dict[str, float] | LoraSet | None  # {adapter name: scale}


class Model:
    def __init__(self, engine: Engine, *, own_lora: dict[str, float] | None = None):
        self.engine = engine
        self.contexts = ContextTable(engine)
        # The model's own adapters (an Ollama model's ADAPTER layers), in every context at scale 1.
        self.own_lora = dict(own_lora or {})

    # -- identity ---------------------------------------------------------------
    @property
    def weight_id(self) -> str:
        return self.engine.weight_id

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def path(self) -> Path:
        return self.engine.path

    @property
    def config(self):
        return self.engine.config

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def chat_template(self):
        return self.engine.chat_template

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.engine.config.arch}, weight_id={self.weight_id[:12]})"

    # -- tokens and logits --------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        return self.engine.tokenize(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.engine.detokenize(ids)

    def logprobs(self, ids: Sequence[int], *, top: int = 40, lora: LoraScales = None) -> LogProbs:
        return self.engine.logprobs(ids, top=top, lora=self._with_own(lora) or self.engine.lora_set(None))

    # -- LoRA adapters ---------------------------------------------------------------
    def load_lora(self, name: str, path: str | os.PathLike) -> LoraAdapter:
        """Load a LoRA adapter file under a name; contexts then pick it by that name."""
        self.engine.check_open()
        return self.engine.load_lora(name, path)

    @property
    def adapters(self) -> dict[str, LoraAdapter]:
        return dict(self.engine.adapters)

    # -- contexts ------------------------------------------------------------------
    def context(self, name: str | None = None, *, lora: LoraScales = None) -> Context:
        """The live context with this name, created empty if it does not exist yet.
        ``lora``: {adapter name: scale} a new context runs with, for its whole life, with
        the model's own adapters (``own_lora``) always."""
        self.engine.check_open()
        return self.contexts.open(name, self._with_own(lora))

    def _with_own(self, lora: LoraScales) -> LoraSet | None:
        """``lora`` with the model's own adapters added (None: no adapters at all)."""
        if not self.own_lora or isinstance(lora, LoraSet):
            return None if lora is None else self._lora_set(lora)
        taken = sorted(set(lora or {}) & set(self.own_lora))
        if taken:
            raise CtxError(f"LoRA adapter {taken[0]!r} is the model's own ADAPTER layer: part of the model, "
                           "always at scale 1")
        return self._lora_set({**self.own_lora, **(lora or {})})

    def _lora_set(self, lora: LoraScales | LoraSet) -> LoraSet:
        """The engine's set for ``lora``; a name not loaded or a bad scale is a RequestError naming it."""
        try:
            return self.engine.lora_set(lora)
        except ValueError as err:
            raise RequestError(str(err), param="lora") from None

    def restore(self, store, ref: str, name: str | None = None, *, lora: LoraScales = None) -> Context:
        """A live context from a stored snapshot (ref, id or id prefix); refuses other
        weights, and other adapters or scales than ``lora`` ({name: scale}; None: the
        ones the snapshot records, which must be loaded)."""
        self.engine.check_open()
        return self.contexts.restore(store, ref, name, None if lora is None else self._lora_set(lora))

    @property
    def chat(self):
        """The chat renderer (text/chat.py): ``model.chat.render(turns, system=, tools=,
        after=, closing=, generation_prompt=)``."""
        return self.engine.chat

    def chat_prompt(self, messages: list[dict], *, add_generation_prompt: bool = True, tools=None,
                    template_kwargs: dict | None = None) -> str:
        """Messages rendered with the model's chat template (parse the result with
        parse_special=True): ``model.chat.render(messages)``, kept as the documented
        shorthand. ``tools``: text.tools.Tool or OpenAI-shaped dicts (text/tools.py).
        ``template_kwargs``: more template variables, JSON values (``{"enable_thinking": False}``
        for Qwen3); a RequestError names a key the renderer sets itself (``messages``...)."""
        return self.engine.chat.render(messages, tools=tools, generation_prompt=add_generation_prompt,
                                       template_kwargs=template_kwargs)

    def close(self) -> None:
        """Delete every context and let go of the weights; then every use of the model, or of
        a context of it, is a ContextError. Closing it again does nothing."""
        self.engine.stop()  # steps in flight end first: a stream on another thread then gets a ContextError
        for name in self.contexts.names():
            self.contexts.remove(name)
        self.engine.close()


def resolve_model(spec: str | os.PathLike | None = None) -> Path:
    """The GGUF file a model name or path means (engine/registry.py), a name
    in one of MODEL_SOURCES included: what ``load`` loads."""
    return registry.resolve_model(spec, sources=MODEL_SOURCES)


def load(model: str | os.PathLike | None = None, *, threads: int | None = None, kv: str = "f16",
         n_ctx: int | None = None, lora: dict[str, str | os.PathLike] | None = None,
         draft: str | os.PathLike | None = None, repack_budget: int | None = None) -> Model:
    """Load a model: the packaged default (None or "smollm2"), a .gguf path, or a known name.

    ``threads``: 1 to 512 (None or 0: one a physical core). ``n_ctx``: the longest a
    context may grow, in tokens (at least 1); a value above the length the model was
    trained for is taken as that length, which ``model.config.n_ctx`` reports.
    ``kv`` is the KV cache dtype: "f16", "q8" (K and V in 8-bit blocks) or
    "vq8" (V only); contexts restore only into a model loaded with theirs.
    ``lora``: {name: adapter .gguf path} to load; a context picks them by name.
    ``draft``: a smaller model with the same vocabulary that drafts tokens for
    speculative decoding (refused, naming the first differing token, otherwise).
    ``repack_budget``: the bytes of copies of the weights laid out for decode
    (products of one or two rows) the model may hold beside the mapped file
    (None: 512 MiB; 0: none). They make decode faster and cost their size in
    memory; the output is the same bits either way (docs/design-notes.md).
    """
    path, own = registry.resolve_with_adapters(model, sources=MODEL_SOURCES)
    engine = Engine(path, threads=threads, kv=kv, n_ctx=n_ctx, repack_budget=repack_budget)
    own_names = {f"adapter{i}" if len(own) > 1 else "adapter": adapter for i, adapter in enumerate(own)}
    try:
        for name, adapter in own_names.items():  # an Ollama model's ADAPTER layers: part of the model
            engine.load_lora(name, adapter)
        for name, adapter in (lora or {}).items():
            engine.load_lora(name, adapter)
    except BaseException:
        engine.close()
        raise
    if draft is not None:
        attach_draft(engine, draft)
    return Model(engine, own_lora=dict.fromkeys(own_names, 1.0))


def attach_draft(engine: Engine, draft: str | os.PathLike) -> None:
    """Load ``draft`` as the engine's draft model, or refuse it (closing the engine)
    when its vocabulary is not the engine's."""
    try:
        path = resolve_model(draft)
        engine.draft = engine if path == engine.path else Engine(
            path, threads=engine.threads, kv=engine.kv_dtype, n_ctx=engine.config.n_ctx,
            repack_budget=engine.repack_budget)
        check_same_vocabulary(engine, engine.draft)
    except BaseException:
        engine.close()
        raise
