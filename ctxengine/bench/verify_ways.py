"""The ways ``ctx verify`` computes a prompt's logits besides the plain one
(verify.py runs them): each returns every row, to be compared bit for bit."""
from __future__ import annotations

import tempfile
from typing import Callable

import numpy as np

from .. import _core
from ..store import Store

ISAS = ("scalar", "avx2", "avx512")


def greedy(model, ids: list[int], n: int, speculative=False) -> list[int]:
    ctx = model.context(None)
    ctx.append(ids)
    out = [p.token_id for p in ctx.generate(n, temperature=0.0, speculative=speculative) if p.token_id is not None]
    ctx.delete()
    return out


class Replay:
    """Drafts for the speculative check: the plain decoding's own next tokens, the
    last of every draft of two or more made wrong, so rows are both kept and dropped."""

    def __init__(self, n_prompt: int, reply: list[int], n_vocab: int):
        self.n_prompt, self.reply, self.n_vocab = n_prompt, reply, n_vocab

    def propose(self, tokens, k):
        at = len(tokens) - self.n_prompt
        draft = list(self.reply[at:at + k])
        if len(draft) > 1:
            draft[-1] = (draft[-1] + 1) % self.n_vocab
        return draft


def all_logits(model, ids):
    return model.engine.forward(model.engine.new_sequence(), ids, all_logits=True)


class Ways:
    """``base`` (N threads) computes the references; ``lone`` is the same model on one
    thread. The references take the N threads, not the one: every check but the thread
    count's runs on ``base``, and a long prompt's (Gemma 3's past its window) logits of
    every position cost seconds a check on one thread."""

    def __init__(self, base, lone, texts, n_gen: int):
        self.base, self.lone, self.n_gen = base, lone, n_gen
        eng = self.eng = base.engine
        self.prompts = [eng.tokenize(p, add_bos=eng.tokenizer.add_bos) for p in texts]
        self.n_short = len(self.prompts)
        self.window = eng.config.swa_window
        if self.window:  # a prompt long enough that the sliding window releases pages before every split point
            long = eng.tokenize(" ".join(texts) * 8, add_bos=eng.tokenizer.add_bos)
            while len(long) < self.window + 4 * eng.pool.page_tokens:
                long += long[1:]
            self.prompts.append(long[: self.window + 4 * eng.pool.page_tokens + 5])

    def checks(self, n_threads: int) -> list[tuple[str, Callable]]:
        checks: list[tuple[str, Callable]] = [
            (f"{n_threads} threads vs 1", lambda ids: all_logits(self.lone, ids)),
            ("token by token vs at once", self.token_by_token),
            ("uneven chunks vs at once", self.chunked),
            ("in a batch of 8 vs alone", self.batched),
            ("forked vs fresh", self.forked),
            ("snapshot-restored vs fresh", self.restored),
            ("speculative vs plain decode", self.speculative),
        ]
        prior = _core.active_isa()
        for isa in ISAS:
            if isa != prior and ISAS.index(isa) <= ISAS.index(_core.detect_isa()):
                checks.append((f"{isa} vs {prior} SIMD path", lambda ids, isa=isa: self.on_isa(ids, isa, prior)))
        return checks

    def split(self, ids) -> int:
        # Past the window for the long prompt (released pages are forked and stored), else half way.
        return len(ids) - 20 if self.window and len(ids) > self.window else len(ids) // 2

    def token_by_token(self, ids):
        seq = self.eng.new_sequence()
        return np.stack([self.eng.forward(seq, [t]) for t in ids])

    def chunked(self, ids):
        seq, rows, start, sizes = self.eng.new_sequence(), [], 0, (3, 1, 5, 2, 7)
        while start < len(ids):
            size = sizes[len(rows) % len(sizes)]
            rows.append(self.eng.forward(seq, ids[start:start + size], all_logits=True))
            start += size
        return np.concatenate(rows)

    def batched(self, ids):
        # The prompt shares one forward step with 7 other sequences of other lengths.
        others = [self.prompts[(k + 1) % len(self.prompts)][: 3 + 2 * k] for k in range(7)]
        items, out = [], None
        for k, toks in enumerate([ids] + others):
            buf = np.empty((len(toks), self.eng.config.n_vocab), np.float32)
            items.append((self.eng.new_sequence(), np.asarray(toks, np.int32), buf, True, None))
            if k == 0:
                out = buf
        self.eng._core.forward(items)
        return out

    def speculative(self, ids):
        # The second half verified as drafts are: 4 true tokens and 3 wrong ones a
        # forward, the wrong ones' KV then dropped (the page table's truncate).
        half, eng = len(ids) // 2, self.eng
        seq = eng.new_sequence()
        rows = [eng.forward(seq, ids[:half], all_logits=True)]
        for a in range(half, len(ids), 4):
            true = ids[a:a + 4]
            wrong = [(t + 1) % eng.config.n_vocab for t in true[:3]]
            rows.append(eng.verify(seq, true + wrong)[:len(true)])
            seq.truncate(a + len(true))
        return np.concatenate(rows)

    def prefilled(self, ids):
        """A context holding ids whose every row of logits was kept: (context, rows)."""
        seq = self.eng.new_sequence()
        rows = self.eng.forward(seq, ids, all_logits=True)
        return self.base.contexts.adopt(None, seq, ids), rows

    def forked(self, ids):
        # Every row is computed here: the trunk's from its own prefill, the rest on
        # the branch after the trunk wrote other tokens into their shared last page.
        half = self.split(ids)
        trunk, before = self.prefilled(ids[:half])
        branch = trunk.fork()
        trunk.append(ids[half:][::-1])
        after = branch.append_logits(ids[half:])
        trunk.delete()
        branch.delete()
        return np.concatenate([before, after])

    def restored(self, ids):
        half = self.split(ids)
        with tempfile.TemporaryDirectory() as d, Store(d) as store:
            ctx, before = self.prefilled(ids[:half])
            ctx.snapshot(store, ref="verify")
            ctx.delete()
            back = self.base.restore(store, "verify")
            after = back.append_logits(ids[half:])
            back.delete()
        return np.concatenate([before, after])

    def restored_greedy(self, ids):
        with tempfile.TemporaryDirectory() as d, Store(d) as store:
            ctx = self.base.context(None)
            ctx.append(ids)
            ctx.snapshot(store, ref="verify")
            ctx.delete()
            back = self.base.restore(store, "verify")
            out = [p.token_id for p in back.generate(self.n_gen, temperature=0.0) if p.token_id is not None]
            back.delete()
        return out

    def on_isa(self, ids, isa: str, prior: str):
        _core.set_isa(isa)
        try:
            return all_logits(self.base, ids)
        finally:
            _core.set_isa(prior)
