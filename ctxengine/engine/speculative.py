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
  ``ForkDrafter``: the model itself, greedy, on a fork of the context's KV;
- ``DraftLength``: the length that pays best for this model's measured step
  costs and the drafts' acceptance, and the switch that turns drafting off
  for a while when no length pays.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from ..errors import CtxError
from .speculation_stats import SpeculationStats  # noqa: F401 (the stats its callers keep)

if TYPE_CHECKING:
    from .. import _core
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
        self.tokens = tokens   # a live list: it may grow, or be cut back (a rewind), between lookups
        self._last: dict[tuple, int] = {}
        self._start = self._done = max(0, start)  # positions in [_start, _done) are indexed

    def update(self) -> None:
        toks, last = self.tokens, self._last
        end = len(toks) - 1  # the last position has no follower yet
        if end < self._done:  # cut back: positions past its end are stale
            self._rebuild()
            return
        for j in range(self._done, end):
            for n in NGRAM_SIZES:
                if j + 1 >= n:
                    last[tuple(toks[j + 1 - n:j + 1])] = j
        self._done = max(self._done, end)

    def _rebuild(self) -> None:
        self._last.clear()
        self._done = self._start
        self.update()

    def follow(self, key: tuple, k: int, *, periodic: bool = False) -> list[int]:
        """The (up to k) tokens after the last occurrence of key; [] if it never occurred.
        ``periodic``: key is the list's own tail, so an occurrence p tokens before it
        says the text repeats with period p, and the guess goes on past the list's end
        (a reply caught in a loop, a run of equal lines): k tokens, not p."""
        j = self._last.get(key)
        if j is not None and (j >= len(self.tokens) - 1 or tuple(self.tokens[j + 1 - len(key):j + 1]) != key):
            self._rebuild()  # cut back and grown again since: what was indexed there has changed
            j = self._last.get(key)
        if j is None:
            return []
        draft = list(self.tokens[j + 1:j + 1 + k])
        if periodic:
            period = len(self.tokens) - 1 - j
            while len(draft) < k:
                draft.append(draft[len(draft) - period])
        return draft


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
                own_tail = index is self.own and tuple(index.tokens[-n:]) == key
                draft = index.follow(key, k, periodic=own_tail)
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
        draft = _greedy(self.engine, self._seq, tokens[n:], k, len(tokens))
        if draft is None:  # its pages go back, and it starts over at the next draft
            self._seq, self._held = self.engine.new_sequence(), []
            return []
        self._held = tokens + draft[:-1]
        return draft


class ForkDrafter:
    """Greedy drafts from the model itself (``draft=`` its own file), on a copy-on-write
    fork of the context's own KV: no second copy of the context in the page pool the
    two share (a model drafting for itself through ModelDrafter held one, outside the
    context table's budget, and could fill the pool where plain decoding fits), only
    the pages the k drafted tokens write, released with the fork."""

    def __init__(self, engine: "Engine", live_seq: Callable[[], "_core.KVSeq | None"], lora: object = None,
                 promise: Callable[[int], object | None] | None = None):
        """``live_seq()``: the context's KVSeq now (None when it has none); ``lora``: the
        adapters its KV was made with, so a draft continues it as the context would;
        ``promise(n)``: n pages held from the context table's budget, or None when they are
        not free now (state/budget.py): the draft's pages come only from pages no one else
        was promised, and where there are none it drafts nothing (it took them from the
        pool, and another stream's reserved step then found the pool full)."""
        self.engine, self.live_seq, self.lora, self.promise = engine, live_seq, lora, promise

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        seq = self.live_seq()
        if seq is None or seq.n_tokens != len(tokens) - 1:
            return []
        fork, held = seq.fork(), []
        try:
            return _greedy(self.engine, fork, [tokens[-1]], k, len(tokens), self.lora,
                           lambda n: self._hold(n, held)) or []
        finally:
            del fork  # its pages go back now, and then the promises that covered them
            for promise in held:
                promise.release()

    def _hold(self, n: int, held: list) -> None:
        """The reserve of a draft's forward: n pages promised (kept in ``held`` until the fork
        is gone, so that another stream's reserve waits for its pages to come back rather than
        find the pool full), or no draft (a CtxError)."""
        if self.promise is None:
            return None
        promise = self.promise(n)
        if promise is None:
            raise CtxError("no pages free for a draft")
        held.append(promise)
        return None  # nothing for the scheduler to release when the forward has run


def _greedy(engine: "Engine", seq, pending: list[int], k: int, n_tokens: int, lora=None,
            reserve: Callable[[int], object] | None = None) -> list[int] | None:
    """Up to k greedy tokens after ``pending`` appended to seq (which holds the rest of
    the n_tokens), within the context length; None when they find no room (no KV pages
    left: a draft source that cannot run drafts nothing, never failing the reply).
    ``reserve``: as engine.forward's."""
    draft: list[int] = []
    extra = ({} if lora is None else {"lora": lora}) | ({} if reserve is None else {"reserve": reserve})
    try:
        while len(draft) < k and n_tokens + len(draft) < engine.config.n_ctx:
            draft.append(int(np.argmax(engine.forward(seq, pending, **extra))))
            pending = draft[-1:]
    except (ValueError, CtxError):
        return None
    return draft


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftLength:
    """How many tokens to draft next: the k that maximises the expected tokens per
    second of the step that verifies them, from the measured cost of a step per row
    count (``costs``: engine/step_cost.py) and the chance ``p`` that a drafted token
    is accepted. Each drafted token is taken as accepted with chance p and the draft
    cut at the first that is not, so k drafts yield ``1 + p + ... + p^k`` tokens
    for the time of ``k + 1`` rows. Among ``others`` rows of other streams the step
    yields theirs too and costs the rows of all: the k that is best for the step's
    total, so a draft never slows the other streams more than it gains.

    When no k promises ``MIN_GAIN`` times the tokens per second of plain decoding
    (for a lone stream; among others, the step's total without a draft), drafting
    stops for ``cooldown`` tokens, doubled at each repeat until drafts pay again;
    then one probe, the best k for the prior's p (at most ``PROBE`` tokens)
    whatever it promises, is verified, since p is only known from drafts. A
    sequence whose drafts keep failing pays for almost none: among other
    streams a row costs so little beside theirs that the prior would probe with
    the sequence's whole share of rows, eight branches at once, and free
    branches ran at 0.77x without speculation that way."""

    KEEP = 0.8           # weight of the past at each draft: about the last five drafts count
    PRIOR = (0.25, 0.5)  # pseudo-counts (accepted, tried) behind p: 0.5 before any draft, half a draft's weight
    MIN_GAIN = 1.1       # what drafting must promise over plain decoding: a margin for its own work
    COOLDOWN = (8, 512)  # first and longest pause, in tokens
    PROBE = 2            # the longest draft a probe verifies: enough to learn p from

    def __init__(self, k_max: int = MAX_DRAFT):
        self.k_max = k_max
        self._accepted = self._tried = 0.0  # decayed sums over drafts: tokens accepted, tokens tried
        self._cooldown = self.COOLDOWN[0]
        self._paused = 0  # tokens left to decode without drafting
        self._probe = True  # the next draft is verified whatever p promises: p is a guess until then

    @property
    def p(self) -> float:
        """The estimated chance that a drafted token is accepted."""
        return (self._accepted + self.PRIOR[0]) / (self._tried + self.PRIOR[1])

    @property
    def active(self) -> bool:
        return self._paused == 0

    def plain_step(self) -> None:
        """A token decoded without a draft."""
        self._paused = max(0, self._paused - 1)

    def choose(self, costs: Sequence[float], others: int = 0, k_max: int | None = None) -> int:
        """The draft length now (0: none), for a step that also holds ``others`` rows;
        ``costs[n]``: the time of a step of n rows (StepCost.curve), at least up to
        ``others + 1 + k_max``."""
        p, base = self.p, others + 1
        plain = base / costs[base] * (self.MIN_GAIN if others == 0 else 1.0)
        best, best_rate, expected = 0, 0.0, float(base)
        for k in range(1, self.k_max + 1 if k_max is None else min(self.k_max, k_max) + 1):
            expected += p ** k
            rate = expected / costs[base + k]
            if rate > best_rate:
                best, best_rate = k, rate
        if self._probe:  # p is still the prior's
            return min(best, self.PROBE)
        if best_rate > plain:
            self._cooldown = self.COOLDOWN[0]  # drafts pay again: a later pause starts short
            return best
        self._paused, self._probe = self._cooldown, True
        self._cooldown = min(2 * self._cooldown, self.COOLDOWN[1])
        self._accepted = self._tried = 0.0  # after the pause, a probe from the prior
        return 0

    def update(self, drafted: int, accepted: int) -> None:
        self._probe = False
        self._accepted = self.KEEP * self._accepted + accepted
        self._tried = self.KEEP * self._tried + accepted + (accepted < drafted)  # the first miss was tried too


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
