"""Speculative decoding's engine half: where drafts come from, and how long they are.

A draft is a guess at the next tokens of a sequence. The context verifies
``k`` drafted tokens in one forward of ``k + 1`` rows (state/speculation.py)
and keeps the longest prefix the sampler itself would have chosen; a wrong
guess costs time only, never a bit of output. So a draft source may be
anything that proposes token ids:

- ``NgramIndex`` / ``LookupDrafter``: the tokens that follow the most recent
  earlier occurrence of the sequence's last n tokens (longest n first), in the
  sequence itself (prompt lookup) and in its relatives (forks and siblings
  sharing its prefix), whose token lists may still be growing;
- ``ModelDrafter``: a smaller model with the same vocabulary, greedy;
- ``DraftLength``: the adaptive length, and the switch that turns drafting
  off for a while when drafts keep failing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from ..errors import CtxError
from .speculation_stats import SpeculationStats  # noqa: F401 (the stats its callers keep)

if TYPE_CHECKING:
    from .engine import Engine

NGRAM_SIZES = (6, 4, 3, 2, 1)  # longest first: a longer match is a more specific guess
MAX_DRAFT = 15                 # k + 1 rows <= a page: a sliding-window model can always step back
MAX_RELATIVES = 8


class Drafter(Protocol):
    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k guessed tokens to follow ``tokens`` (fewer, or none, when it has no guess)."""


class NgramIndex:
    """Every n-gram of a growing token list (n in NGRAM_SIZES) -> where it last ended,
    among positions that have a token after them."""

    def __init__(self, tokens: Sequence[int], start: int = 0):
        self.tokens = tokens   # a live list: it may grow between lookups
        self._last: dict[tuple, int] = {}
        self._done = max(0, start)  # positions < _done are indexed

    def update(self) -> None:
        toks, last = self.tokens, self._last
        end = len(toks) - 1  # the last position has no follower yet
        for j in range(self._done, end):
            for n in NGRAM_SIZES:
                if j + 1 >= n:
                    last[tuple(toks[j + 1 - n:j + 1])] = j
        self._done = max(self._done, end)

    def follow(self, key: tuple, k: int) -> list[int]:
        """The (up to k) tokens after the last occurrence of key; [] if it never occurred."""
        j = self._last.get(key)
        return [] if j is None else list(self.tokens[j + 1:j + 1 + k])


class LookupDrafter:
    """Prompt lookup over a sequence's own tokens, then over its relatives'."""

    def __init__(self, tokens: Sequence[int], relatives: Sequence[tuple[Sequence[int], int]] = ()):
        """``relatives``: (a relative's live token list, how many leading tokens it
        shares with ours: those are not indexed twice)."""
        self.own = NgramIndex(tokens)
        self.others = [NgramIndex(t, shared - max(NGRAM_SIZES)) for t, shared in relatives[:MAX_RELATIVES]]

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        indexes = [self.own, *self.others]
        for index in indexes:
            index.update()
        for n in NGRAM_SIZES:
            if len(tokens) < n:
                continue
            key = tuple(tokens[-n:])
            for index in indexes:
                draft = index.follow(key, k)
                if draft:
                    return draft
        return []


class ModelDrafter:
    """Greedy drafts from a second model with the same vocabulary; its KV follows
    the sequence's tokens (cut back to the common prefix, then extended)."""

    def __init__(self, engine: "Engine"):
        self.engine = engine
        self._seq = engine.new_sequence()
        self._held: list[int] = []  # the tokens whose KV self._seq holds

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        tokens = list(tokens)
        n = _common_prefix(self._held, tokens)
        if n == len(tokens):  # logits after the last token are needed: run it again
            n -= 1
        if n < self._seq.n_tokens:
            if self._seq.can_truncate(n):
                self._seq.truncate(n)
            else:
                self._seq, n = self.engine.new_sequence(), 0
        draft: list[int] = []
        pending = tokens[n:]
        while len(draft) < k and len(tokens) + len(draft) < self.engine.config.n_ctx:
            logits = self.engine.forward(self._seq, pending)
            draft.append(int(np.argmax(logits)))
            pending = draft[-1:]
        self._held = tokens + draft[:-1]
        return draft


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftLength:
    """How many tokens to draft next: more after a fully accepted draft, the accepted
    length plus one after a partial one. When the share of drafted tokens accepted
    (a moving average) falls below ``MIN_RATE``, drafting stops for ``cooldown``
    tokens, doubled at each repeat, so a sequence whose drafts keep failing pays
    for almost none: a verified row that is thrown away costs a row of work."""

    MIN_RATE = 0.3
    KEEP = 0.5           # weight of the old average at each draft
    COOLDOWN = (8, 512)  # first and longest pause, in tokens

    def __init__(self, k: int = 4, k_max: int = MAX_DRAFT):
        self.k, self.k_max = min(k, k_max), k_max
        self.rate = 0.5  # moving average of accepted / drafted
        self._cooldown = self.COOLDOWN[0]
        self._paused = 0  # tokens left to decode without drafting

    @property
    def active(self) -> bool:
        return self._paused == 0

    def plain_step(self) -> None:
        """A token decoded without a draft."""
        self._paused = max(0, self._paused - 1)

    def update(self, drafted: int, accepted: int) -> None:
        if accepted == drafted:
            self.k = min(self.k_max, self.k + 2)
        else:
            self.k = max(1, min(self.k, accepted + 1))
        share = accepted / max(1, drafted)
        self.rate = self.KEEP * self.rate + (1 - self.KEEP) * share
        if share >= 0.5:
            self._cooldown = self.COOLDOWN[0]
        if self.rate < self.MIN_RATE:
            self._paused, self.rate = self._cooldown, 0.5  # then try again, from neutral
            self._cooldown = min(2 * self._cooldown, self.COOLDOWN[1])


def check_same_vocabulary(model: "Engine", draft: "Engine") -> None:
    """Refuse a draft model whose tokens are not the model's, naming the first that differs."""
    a, b = model.tokenizer, draft.tokenizer
    for i in range(min(a.n_vocab, b.n_vocab)):
        if a.token_bytes(i) != b.token_bytes(i):
            raise CtxError(f"draft model {draft.name} has another vocabulary than {model.name}: "
                           f"token {i} is {b.token_bytes(i)!r} there, {a.token_bytes(i)!r} here")
    if a.n_vocab != b.n_vocab:
        raise CtxError(f"draft model {draft.name} has another vocabulary than {model.name}: "
                       f"{b.n_vocab} tokens there, {a.n_vocab} here (token {min(a.n_vocab, b.n_vocab)} "
                       "is the first in only one)")
