"""Which served models a ``--draft`` model drafts for and a ``--lora`` adapter loads
into, and the one warning line for each that it does not, so that a skip is never
silent (docs/speculative.md, docs/lora.md).

A draft must share the vocabulary of the model it drafts for; an adapter must have
been made for the model's architecture. Both are read from the files' headers at
``ctx serve`` start for every model whose file is there (``check_at_start``): a draft
that fits none of them is refused, as it would only fail every request. What the
headers cannot tell (an adapter's shapes, a packaged model not built yet) is decided
when the model loads, and told then, once.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Sequence

from ..engine.catalog import CatalogEntry
from ..engine.gguf_file import open_gguf
from ..engine.speculative import check_same_vocabulary
from ..errors import CtxError
from ..text.tokenizer import Tokenizer
from .lora import LoraSpec

Warn = Callable[[str], None]


class ServedFits:
    """The draft and adapters of one server, checked against each model it serves."""

    def __init__(self, draft: str | None, lora: Sequence[LoraSpec], warn: Warn | None = None):
        self.draft = draft
        self.lora = tuple(lora)
        self.warn: Warn = warn or logging.getLogger(__name__).warning
        self._draft_vocabulary: SimpleNamespace | None = None
        self._draft_misfits: dict[Path, str | None] = {}  # model file -> why the draft cannot draft for it
        self._told: set[tuple] = set()  # what has been warned of, once each
        self._lock = threading.Lock()

    def check_at_start(self, entries: Iterable[CatalogEntry]) -> None:
        """Warn of each served model the draft or an adapter does not fit; CtxError if the
        draft fits none of them (and no model is left whose fit only its load can tell)."""
        present = [e for e in entries if e.servable and e.path is not None and Path(e.path).is_file()]
        if self.draft is not None:
            self._check_draft(present, undecided=any(e.servable and e not in present for e in entries))
        archs = {entry.name: _header(entry.path, lambda f: f.arch) for entry in present}  # each file once
        for spec in self.lora:
            adapter = _header(spec.path, lambda f: ((f.get("general.type"), f.get("adapter.type")), f.arch))
            for entry in present:
                why = _lora_misfit(Path(spec.path).name, adapter, archs[entry.name])
                if why is not None:
                    self._tell(("lora", spec.name, entry.name), _lora_line(spec.name, entry.name, why))

    def drafts_for(self, entry: CatalogEntry, path: Path) -> bool:
        """Whether the draft drafts for this model (loading now from ``path``); told if not."""
        if self.draft is None:
            return False
        why = self._draft_misfit(path)
        if why is not None:
            self._tell(("draft", entry.name), f"--draft {self.draft} does not draft for {entry.name}, which "
                                              f"decodes without it: {why}")
        return why is None

    def loras_skipped(self, entry: CatalogEntry, skipped: dict[str, str]) -> None:
        """A model has loaded without these adapters (name -> why): told, once each."""
        for name, why in skipped.items():
            self._tell(("lora", name, entry.name), _lora_line(name, entry.name, why))

    # -- internals ------------------------------------------------------------------------
    def _check_draft(self, present: list[CatalogEntry], undecided: bool) -> None:
        misfits = {}
        for entry in present:
            try:
                why = self._draft_misfit(entry.path)
            except (CtxError, OSError):
                continue  # a model whose vocabulary cannot be read: its load says why
            if why is not None:
                misfits[entry.name] = why
        if not misfits:
            return
        names = ", ".join(misfits)
        if len(misfits) == len(present) and not undecided:
            raise CtxError(f"--draft {self.draft}: its vocabulary is not that of any served model ({names}), so "
                           f"it could draft for none of them; a draft model must share its model's tokens "
                           f"({next(iter(misfits.values()))})")
        for name in misfits:
            self._told.add(("draft", name))
        self.warn(f"--draft {self.draft} has another vocabulary than {names}, which decode without it (it "
                  "drafts for the served models that share its vocabulary)")

    def _draft_misfit(self, path: Path) -> str | None:
        """Why the draft cannot draft for the model in ``path`` (None: it can); cached."""
        path = Path(path)
        with self._lock:
            if path not in self._draft_misfits:
                self._draft_misfits[path] = self._compare(path)
            return self._draft_misfits[path]

    def _compare(self, path: Path) -> str | None:
        from ..state.model import resolve_model  # as attach_draft resolves it (Ollama's models too)

        draft_path = resolve_model(self.draft)
        if path.resolve() == draft_path.resolve():
            return None  # the model drafts for itself
        if self._draft_vocabulary is None:
            self._draft_vocabulary = _vocabulary(draft_path)
        try:
            check_same_vocabulary(_vocabulary(path), self._draft_vocabulary)
        except CtxError as err:
            return str(err)
        return None

    def _tell(self, key: tuple, line: str) -> None:
        with self._lock:
            if key in self._told:
                return
            self._told.add(key)
        self.warn(line)


def _vocabulary(path: Path) -> SimpleNamespace:
    """What check_same_vocabulary reads of an Engine (its tokenizer and name), from the
    file's header alone: no weights are mapped for it."""
    with open_gguf(path) as f:
        return SimpleNamespace(tokenizer=Tokenizer.from_file(f),
                               name=str(f.get("general.name") or Path(path).stem))


def _header(path: Path, read: Callable):
    """``read`` of a GGUF's header, or None where it cannot be read (its load says why)."""
    try:
        with open_gguf(path, header_only=True) as f:
            return read(f)
    except (CtxError, OSError):
        return None


def _lora_misfit(label: str, adapter: tuple | None, model_arch: str | None) -> str | None:
    """Why the adapter's header ((general.type, adapter.type), arch) says it cannot load into a
    model of ``model_arch`` (engine/lora.py's words for it); None where only loading it can tell."""
    if adapter is None or model_arch is None:
        return None  # unreadable: the load's error says why, in its own words
    kind, arch = adapter
    if kind != ("adapter", "lora"):
        return f"{label}: not a LoRA adapter (general.type {kind[0]!r}, adapter.type {kind[1]!r})"
    if arch != model_arch:
        return f"{label}: an adapter for architecture {arch!r}, and this model is {model_arch!r}"
    return None


def _lora_line(name: str, model: str, why: str) -> str:
    return f"--lora {name} is not loaded with {model} (requests to it cannot use it): {why}"
