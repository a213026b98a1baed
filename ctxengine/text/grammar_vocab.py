"""llguidance's view of our tokenizer: every token's bytes as ``Tokenizer.token_bytes``
gives them, control tokens marked with a 0xFF prefix as llguidance's llama.cpp binding
marks them, and every end-of-generation id as an EOS the grammar may allow."""
from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..errors import CtxError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

def _llg():
    try:
        import llguidance
    except ImportError:  # a dependency of ctxengine: only a broken install gets here
        raise CtxError("constrained sampling needs the llguidance package (pip install llguidance)") from None
    return llguidance


_vocabs: "weakref.WeakKeyDictionary[Tokenizer, Any]" = weakref.WeakKeyDictionary()
_vocab_lock = threading.Lock()


class _VocabSource:
    """What llguidance's TokenizerWrapper reads: ids' bytes, EOS/BOS, and an encoder."""

    def __init__(self, tok: "Tokenizer"):
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.eog_ids)
        self.bos_token_id = tok.bos_id
        self.tokens = [(b"\xff" if tok.is_control(i) else b"") + tok.token_bytes(i) for i in range(tok.n_vocab)]
        self._tok = tok

    def __call__(self, s: str | bytes) -> list[int]:
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        return self._tok.encode(s)


def grammar_vocab(tok: "Tokenizer"):
    """llguidance's view of a tokenizer, built once per tokenizer (~0.3 s for 49k tokens)."""
    with _vocab_lock:
        vocab = _vocabs.get(tok)
        if vocab is None:
            llg = _llg()
            eos = sorted(tok.eog_ids) or [_VocabSource(tok).eos_token_id]
            vocab = llg.LLTokenizer(llg.TokenizerWrapper(_VocabSource(tok)), n_vocab=tok.n_vocab, eos_token=eos)
            _vocabs[tok] = vocab
        return vocab
