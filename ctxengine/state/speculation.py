"""Speculative decoding inside a context's generation, invisible in its output.

``Context.generate`` asks for the logits of its next token and samples from
them, one token at a time, exactly as without speculation. Speculation only
changes where those logits come from. When the context's KV lags its tokens
by the one token just sampled, ``t``, a drafter guesses ``d1..dk`` and one
forward runs ``t, d1..dk`` (``k + 1`` rows, through the scheduler, in the same
step as other sequences' rows). Row ``i`` is the logits after ``d_i``,
bit-identical to decoding that position alone, because a row's logits do not
depend on its place in a batch. So the generation samples from row 0; while
the token it sampled equals the next draft, the next row is already the right
logits; at the first token that differs (or after the last row) the rows past
it are dropped, and their KV with them (``settle``: the page table's own
truncate, which copies a shared page before zeroing its tail).

Sampling is untouched: the same logits, the same penalties and grammar mask,
one RNG draw per emitted token; so tokens, logits and the final KV bytes are
those of plain decoding, whatever was drafted.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from ..engine.lora import LoraSet
from ..engine.scheduler import pages_needed
from ..engine.speculative import (Drafter, DraftLength, ForkDrafter, LookupDrafter, ModelDrafter,
                                  SpeculationStats)
from ..errors import RequestError
from .residency import KVState, Residency

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from .budget import PageBudget, Promise

MIN_SHARED = 16  # a relative shares at least this many leading tokens (or all of the shorter)
# Among other streams a sequence drafts at most its share of SHARED_ROWS a step,
# so one stream's drafts never make a step many times longer for all the others.
SHARED_ROWS = 16


class Relatives(Protocol):
    """The table a speculating context lives in, as far as its drafter looks."""

    budget: PageBudget  # the page pool's promises

    def others(self, ctx: Speculating) -> Sequence[Speculating]: ...


class Speculating(Protocol):
    """What a speculation works on: the context whose generation it runs in
    (state/context.py's Context, which imports this module), down to the
    package-private parts it shares with ``Context.generate``: the live token
    list, the KV state, the forward that computes the lag and its page promise."""

    lora: LoraSet
    speculation: SpeculationStats
    _tokens: list[int]
    _kv: KVState
    _table: Relatives
    _speculation: "Speculation | None"  # the generation's now under way, if any

    @property
    def engine(self) -> Engine: ...
    def _sync(self) -> np.ndarray | None: ...
    def _reserve_pages(self, n: int) -> Promise: ...
    def _truncated(self, seq, n: int): ...


class Speculation:
    """One generation's drafts and verified rows over its context."""

    def __init__(self, ctx: Speculating, drafter: Drafter, max_tokens: int):
        self.ctx = ctx
        self.drafter = drafter
        # The built-in drafters read the live token list (never writing it); another is given a
        # copy, so that one building its guesses on its argument cannot change the context.
        self._shown = list if isinstance(drafter, (LookupDrafter, ModelDrafter, ForkDrafter)) else tuple
        self._end = len(ctx._tokens) + max_tokens  # no draft reaches past the generation's last token
        self.length = DraftLength()
        self.stats = SpeculationStats()
        self._base = 0                   # KV position of the first verified row's token
        self._draft: list[int] = []      # the tokens after it, in the KV
        self._rows: np.ndarray | None = None  # (k + 1, n_vocab): logits after each
        self._used = 0                   # rows handed out

    def next_logits(self) -> np.ndarray:
        """The logits after the context's last token (the one the generation just sampled)."""
        ctx = self.ctx
        if self._rows is not None:
            i = self._used
            toks = ctx._tokens
            if i <= len(self._draft) and len(toks) == self._base + i + 1 and toks[-1] == self._draft[i - 1]:
                self._used += 1
                return self._rows[i]
            self.settle()
        seq = ctx._kv.seq
        if not self.length.active or seq is None or seq.n_tokens != len(ctx._tokens) - 1:
            self.length.plain_step()
            return ctx._sync()
        n = len(ctx._tokens)
        k = self._budget(min(ctx.engine.config.n_ctx - n, self._end - 1 - n))
        tokens = ctx._tokens if self._shown is list else tuple(ctx._tokens)
        draft = vocabulary_ids(self.drafter.propose(tokens, k), k, ctx.engine.config.n_vocab) if k > 0 else []
        if not draft:
            self.length.plain_step()
            return ctx._sync()
        draft, reserve = self._fit(seq, draft)
        if not draft:
            self.length.plain_step()
            return ctx._sync()
        base = seq.n_tokens
        # The drafts' rows may be taken back: no page is released past what the kept
        # length calls for (settle ends the deferral), so the pages end as plain decoding's.
        seq.defer_release(True)
        try:
            rows = ctx.engine.verify(seq, [ctx._tokens[-1], *draft], reserve=reserve, lora=ctx.lora)
        except BaseException:
            seq.defer_release(False)
            raise
        self._base, self._draft, self._rows, self._used = base, draft, rows, 1
        return rows[0]

    def _fit(self, seq, draft: list[int]):
        """(the drafts to verify, how their pages are reserved): the drafts never make the
        pool evict a context or wait where plain decoding would not. Rows on pages beyond
        the ones plain decoding's one row needs go only onto pages free right now; when
        there are none, the draft is cut back to the pages plain decoding takes anyway."""
        page = self.ctx.engine.scheduler.page_tokens
        need = pages_needed(seq, 1 + len(draft), page)
        if need > pages_needed(seq, 1, page):
            held = self.ctx._table.budget.promise(need)
            if held is not None:
                return draft, lambda n: held
            plain_end = -(-(seq.n_tokens + 1) // page) * page  # the end of the page plain decoding's row lands on
            draft = draft[:plain_end - seq.n_tokens - 1]
        return draft, self.ctx._reserve_pages

    def finish(self) -> None:
        """The generation is over: settle, count, and let go of the context (unless a later
        generate() of the same context has taken it over)."""
        self.settle()
        self.ctx.speculation = self.stats
        if self.ctx._speculation is self:
            self.ctx._speculation = None

    def _budget(self, room: int) -> int:
        """How many tokens to draft now, at most ``room``: the length that pays best
        for a step with this model's measured costs and the other streams' rows."""
        if room <= 0:
            return 0
        scheduler = self.ctx.engine.scheduler
        others = max(0, scheduler.crowd - 1)  # each decodes a row in the step, as in the last
        limit = min(room, self.length.k_max if others == 0 else SHARED_ROWS // (others + 1) - 1)
        if limit <= 0:
            return 0
        return self.length.choose(scheduler.step_cost.curve(others + 1 + limit), others, limit)

    def settle(self) -> None:
        """Drop the KV of drafts the generation did not emit: the context is left as plain
        decoding leaves it (KV of every token but the last, and the logits after it)."""
        if self._rows is None:
            return
        ctx, toks, draft = self.ctx, self.ctx._tokens, self._draft
        accepted = 0
        while (accepted < len(draft) and self._base + 1 + accepted < len(toks)
               and toks[self._base + 1 + accepted] == draft[accepted]):
            accepted += 1
        self.stats.add(len(draft), accepted)
        self.length.update(len(draft), accepted)
        ctx.engine.speculation.add(len(draft), accepted)
        # The KV plain decoding holds: the tokens whose logits were asked for (the rows handed
        # out), never a token a grammar's closer forced after them without asking, even
        # where it matches a draft (plain decoding computes its KV only at the next ask).
        keep = min(self._base + self._used, len(toks) - 1)
        rows, self._rows = self._rows, None
        kv = ctx._kv
        if kv.state is not Residency.LIVE:
            return  # deleted meanwhile (an eviction settles it first)
        if kv.seq.can_truncate(keep):
            kv.seq.truncate(keep)
            kv.seq.defer_release(False)  # now release what the kept length calls for
            if keep > self._base:  # else nothing was sampled from the rows: the old logits stand
                kv.set_kv(kv.seq, rows[keep - self._base - 1].copy())
        else:  # a sliding-window release stepped past keep: recompute (bit-identical)
            kv.seq.defer_release(False)
            kv.set_kv(ctx._truncated(kv.seq, keep), None)


def start_speculation(ctx: Speculating, speculative, max_tokens: int) -> Speculation | None:
    """A generation's speculation: ``speculative`` None (the model's default), False
    (none: the context's counts are reset), True (the default drafter) or a drafter."""
    if not (speculative is None or isinstance(speculative, bool) or callable(getattr(speculative, "propose", None))):
        # refused before the paused generation's drafts are settled: a refusal changes nothing
        raise RequestError("speculative must be None, True, False or a drafter with propose(tokens, k), "
                           f"not {type(speculative).__name__}", param="speculative")
    if ctx._speculation is not None:  # another generate() of this context, paused: its drafts go first
        ctx._speculation.settle()
    if speculative is None:
        speculative = ctx.engine.speculative
    if speculative is False:
        ctx.speculation = SpeculationStats()
        return None
    return Speculation(ctx, default_drafter(ctx) if speculative is True else speculative, max_tokens)


def vocabulary_ids(draft, k: int, n_vocab: int) -> list[int]:
    """The first k of a drafter's guesses, up to the first that is no token id of the model (a
    bool, a float, -1, n_vocab): a wrong guess is only a draft that fails, never an error."""
    out = []
    for t in list(draft or ())[:k]:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < n_vocab:
            break
        out.append(int(t))
    return out


def default_drafter(ctx: Speculating) -> Drafter:
    """The draft model if one is loaded, else lookup over the context and its relatives."""
    draft_engine = getattr(ctx.engine, "draft", None)
    if draft_engine is ctx.engine:  # a model drafting for itself: on a fork of the context's own KV
        return ForkDrafter(ctx.engine, lambda: ctx._kv.seq if ctx._kv.state is Residency.LIVE else None, ctx.lora,
                           promise=ctx._table.budget.promise)
    if draft_engine is not None:
        return ModelDrafter(draft_engine)
    return LookupDrafter(ctx._tokens, relatives(ctx, ctx._table.others(ctx)))


def relatives(ctx: Speculating, others: Sequence[Speculating]) -> list[tuple[list[int], int]]:
    """(live token list, shared leading tokens) of the contexts that share ctx's beginning
    (its forks, siblings, the prefix cache's entries), the longest shared first."""
    mine = ctx._tokens
    found = []
    for other in others:
        theirs = other._tokens
        need = min(MIN_SHARED, len(mine), len(theirs))
        if need == 0 or theirs[:need] != mine[:need]:
            continue
        n = min(len(mine), len(theirs))
        a, b = np.asarray(mine[:n]), np.asarray(theirs[:n])
        diff = np.flatnonzero(a != b)
        shared = int(diff[0]) if len(diff) else n
        if shared < len(theirs):  # it holds something we do not
            found.append((theirs, shared))
    found.sort(key=lambda f: -f[1])
    return found
