"""A live, named context: token ids, a KV page table, sampler state, labels.

A context's KV may lag its tokens: tokens sampled by ``generate`` are kept and
prefilled on the next step that needs them (``_sync``), so a stream never
pays a forward pass for a token nobody reads the logits of. Where its KV is
(live, being evicted, evicted to the store, deleted) is its residency
(state/residency.py); the unfinished grammar it may carry, state/constraint.py.
"""
from __future__ import annotations

from contextlib import contextmanager
from numbers import Integral
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

import numpy as np

from ..errors import ContextError
from . import conversation
from .constraint import Steering, forked_constraint, stored_constraint
from .arguments import checked_count
from .handoff_lock import HandoffLock
from ..text.grammar import Constraint, Grammar, as_grammar
from ..engine.lora import NO_LORA, LoraSet, check_finite
from ..engine.sampler import Sampler, StopMatcher
from ..engine.speculative import SpeculationStats
from ..store.manifest import checked_labels
from .piece import Piece
from .residency import KVState, Residency, truncated
from .speculation import Speculation, start_speculation
from ..text.tokenizer import StreamDecoder

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..store import Store
    from .budget import Promise
    from .page_keys import PageKeyCache
    from ..text.lazy_calls import LazyCalls


class Table(Protocol):
    """What a context needs of the table it lives in (state/table.py's ContextTable, which
    imports this module): its engine, pages, LRU clock, neighbours, and way to the store."""

    engine: Engine
    page_keys: PageKeyCache

    def touch(self, ctx: Context) -> None: ...
    def reserve_pages(self, n: int, keep: Context | None = None) -> Promise: ...
    def adopt(self, name: str | None, seq, tokens: Sequence[int], **state) -> Context: ...
    def remove(self, name: str, only: Context | None = None) -> None: ...
    def others(self, ctx: Context) -> list[Context]: ...
    def snapshot(self, ctx: Context, store: Store, ref: str | None, labels: dict[str, str] | None) -> str: ...
    def bring_back(self, ctx: Context) -> None: ...


class Context:
    def __init__(self, table: Table, name: str, seq, tokens: Sequence[int] = (), *,
                 labels: dict[str, str] | None = None, sampler_state: dict | None = None,
                 last_logits: np.ndarray | None = None, snapshot_id: str | None = None,
                 constraint: "Constraint | dict | None" = None, lora: LoraSet = NO_LORA):
        self._table = table
        self.name = name
        self._kv = KVState(name, seq, last_logits)  # residency, page table, last logits
        self._tokens = list(tokens)
        self.labels = checked_labels(labels)  # before it is anyone's: a bad one fails every snapshot
        self.sampler_state = sampler_state  # of the last generate(); continues its RNG
        self.finish_reason: str | None = None
        self.snapshot_id = snapshot_id  # restored from or last snapshotted to: its next snapshot's parent
        # The unfinished grammar of the last generation: live, or as a stored
        # state (a restore) that is replayed when a generation first needs it.
        self._constraint = constraint
        self.lora = lora  # the adapters and scales its KV is made with: fixed for its life (never two sets)
        # The running generation's speculation (its drafts' KV may lie past our
        # tokens until it settles), and the drafted/accepted counts of the last one.
        self._speculation: Speculation | None = None
        self.speculation = SpeculationStats()
        # The one lock, held by whoever uses it: a request, a paused stream (which whatever
        # thread resumes it carries along: handoff_lock.py), an eviction.
        self._lock = HandoffLock()

    # -- what it is -----------------------------------------------------------
    @property
    def engine(self) -> "Engine":
        return self._table.engine

    @property
    def weight_id(self) -> str:
        return self.engine.weight_id

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @property
    def residency(self) -> Residency:
        """Where its KV is now: LIVE, EVICTING, EVICTED (read back on next use) or DELETED."""
        return self._kv.state

    @contextmanager
    def hold(self, *, resident: bool = True) -> Iterator["Context"]:
        """This context for one request's use: its lock held (other requests on it queue
        up) until the block ends. ``resident``: read it back first if evicted, and raise
        ContextError if deleted; False leaves it where it is (see ``residency``)."""
        with self._lock:
            if resident:
                self._check_live()
            yield self

    @property
    def n_cached(self) -> int:
        """Tokens whose KV is computed (the rest are prefilled on next use)."""
        with self.hold():
            return self._kv.seq.n_tokens

    def cached_now(self) -> int | None:
        """``n_cached`` without waiting or reading an evicted context back: None while a
        request holds the context (its KV is growing), 0 while its KV is not in memory."""
        return self._lock.if_free(lambda: self._kv.seq.n_tokens if self._kv.state is Residency.LIVE else 0)

    def page_ids(self) -> list[int] | None:
        """Ids of the KV pages this context holds in its model's pool (forks share them until one
        writes; empty while evicted), or None while another thread uses it (its table may be growing)."""
        return self._lock.if_free(lambda: list(self._kv.seq.pages) if self._kv.state is Residency.LIVE else [])

    @property
    def text(self) -> str:
        return self.engine.detokenize(self._tokens)

    def __repr__(self) -> str:
        adapters = f", lora: {self.lora.describe()}" if self.lora else ""
        return f"Context({self.name!r}, {self.n_tokens} tokens{adapters})"

    # -- growing it -----------------------------------------------------------
    def append(self, content: str | Sequence[int], *, parse_special: bool = False) -> int:
        """Add text or token ids and prefill what is new; returns the number of new tokens.

        The first text of an empty context gets the model's BOS token if the
        model wants one. ``parse_special`` turns control-token text (like
        ``<|im_start|>``) into those tokens; leave it off for untrusted text.
        """
        with self.hold():
            if isinstance(content, str):
                self._check_room(self.engine.tokenizer.at_least_tokens(content), "at least ")  # before any BPE
                content = self.engine.tokenize(content, parse_special=parse_special)
                content = content if self._tokens else self.engine.tokenizer.with_bos(content)
            ids = self.engine.checked_ids(content)  # ids in range before any is kept, from text too
            self._check_room(len(ids))
            self._constraint = None
            self._tokens.extend(ids)
            try:
                self._sync()
            except BaseException:  # not prefilled (a cancelled or failed step puts the KV back): not kept
                del self._tokens[len(self._tokens) - len(ids):]
                raise
            self._table.touch(self)
            return len(ids)

    def append_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Append token ids; the logits after each of them, (len(ids), n_vocab), every
        row computed (``ctx verify`` compares them across ways of reaching this KV)."""
        with self.hold():
            ids, kv = self.engine.checked_ids(ids), self._kv
            self._check_room(len(ids))
            lag = self._tokens[kv.seq.n_tokens:]  # the last sampled token's KV, if it lags
            rows = self.engine.forward(kv.seq, lag + ids, all_logits=True, reserve=self._reserve_pages,
                                       lora=self.lora) if ids else np.empty((0, self.engine.config.n_vocab))
            self._constraint = None
            self._tokens.extend(ids)
            if ids:
                kv.computed(rows[-1].copy())
            self._table.touch(self)
            return rows[len(lag):]

    def chat(self, messages: "str | Sequence[dict]", max_tokens: int = 256, *, tools=None, **generate) -> str:
        """Continue the conversation this context holds: the new turns (a user's
        text, or chat messages) rendered after it, the reply generated
        (``generate``'s options) and its turn closed; the reply's text."""
        return conversation.chat(self, messages, max_tokens, tools=tools, **generate)

    def append_turns(self, messages: "str | Sequence[dict]", *, tools=None) -> int:
        """Append chat turns after what the context holds, ending on the prompt for the
        assistant's reply (an open reply is closed first); the number of new tokens."""
        return conversation.append_turns(self, messages, tools=tools)

    def append_system(self, text: str) -> int:
        """Add a system message: rendered with the model's chat template when it has one (a
        RequestError where that would drop it, as Gemma 3's does), else as plain text."""
        return conversation.append_system(self, text)

    def generate(self, max_tokens: int = 256, *, stop: Sequence[str] | None = (), grammar: Grammar | str | None = None,
                 json_schema=None, close_json: bool = True, speculative=None, calls: "LazyCalls | None" = None,
                 **sampling) -> Iterator[Piece]:
        """Stream up to max_tokens sampled tokens as pieces of text, cut at the first of ``stop`` (strings).

        Sampling options are SamplerParams fields (temperature, top_k, ..., seed, logit_bias). With no
        seed, the RNG continues from this context's last generation (or the one paused now: a fork or
        snapshot made between two pieces goes on exactly as the original would, grammar included).

        ``grammar`` (GBNF text or a Grammar) or ``json_schema`` (a dict or its JSON text) constrain the
        output; it ends ("stop") when the grammar is complete, or ("length") unfinished, and then a
        later generate() without a grammar continues it. Under a JSON grammar (a schema, a forced tool
        call) ``close_json`` steers the output to close within max_tokens whenever its shortest
        completion fits (text/closing.py); ``close_json=False`` cuts it where max_tokens falls.

        A piece never holds part of a character: one a generation cut ("length") waits for the
        next generate() on this context (or a fork of it), whose first piece then holds it whole.

        ``speculative``: verify drafted tokens several to a forward (state/speculation.py); the output
        is the same bits either way. None: the model's default (on); False: off; or a draft source
        (an object with ``propose(tokens, k)``). ``self.speculation`` counts drafted and accepted tokens.
        ``calls`` (text/lazy_calls.py's LazyCalls): tools the model may call of its own accord, each
        call constrained from its opening tag to its end (without a grammar of the reply's own).
        """
        with self.hold():
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, Integral) or max_tokens < 0:
                raise ContextError(f"max_tokens must be an int >= 0, not {max_tokens!r}")
            sampler = self._make_sampler(sampling)
            tok = self.engine.tokenizer
            steer = Steering(self._constraint, as_grammar(grammar, json_schema), tok, self._tokens, close_json, calls)
            decoder = StreamDecoder(tok, after=self._tokens)  # a character the last generate() left unfinished
            matcher = StopMatcher(stop, active=steer.stops_apply)
            self.finish_reason = "length"
            spec = self._speculation = start_speculation(self, speculative, max_tokens)
            try:
                for i in range(max_tokens):
                    if len(self._tokens) >= self.engine.config.n_ctx:
                        break
                    left = min(max_tokens - i, self.engine.config.n_ctx - len(self._tokens))
                    token = steer.forced(left)
                    if token is None:
                        token = steer.checked(self._sample(sampler, steer.constraint, spec), left)
                    steer.advance(token)
                    self._tokens.append(token)
                    if token in tok.eog_ids:
                        self.finish_reason = "stop"
                        break
                    steer.appended(self._tokens)
                    text, hit = matcher.push(decoder.push(token))
                    self.sampler_state, self._constraint = sampler.state(), steer.kept  # seen by a fork now
                    yield Piece(text, token)
                    self._lock.adopt()  # resumed, perhaps on another thread
                    if hit:
                        self.finish_reason = "stop"
                        return
                    if steer.done:
                        self.finish_reason = "stop"  # complete: only an end of turn could follow
                        break
                held = decoder.flush() if self.finish_reason == "stop" else ""  # else: the next generate()'s
                rest = matcher.push(held)[0] + matcher.flush()
                if rest:
                    yield Piece(rest, None)
            finally:
                self._lock.adopt()  # ended, perhaps on another thread (a close from there)
                if spec is not None:
                    spec.finish()
                self.sampler_state = sampler.state()
                # A finished grammar is over; an unfinished one waits for the next generate().
                self._constraint = steer.kept if self.finish_reason != "stop" else None
                self._table.touch(self)

    def _sample(self, sampler: Sampler, constraint: Constraint | None, spec: "Speculation | None") -> int:
        if constraint is not None:
            constraint.prefetch()  # the mask is computed while the forward pass runs
        logits = self._sync() if spec is None else spec.next_logits()
        if constraint is not None:
            logits = constraint.mask(logits)
        if self.lora:  # an adapter at too large a scale: say so (the sampler would refuse without the cause)
            check_finite(logits, self.lora)
        return sampler.sample(logits, self._tokens)

    # -- branching --------------------------------------------------------------
    def fork(self, name: str | None = None, *, n_tokens: int | None = None) -> "Context":
        """A new context sharing every KV page copy-on-write: O(pages), no KV copied.

        With ``n_tokens`` the branch holds only the first n tokens (a shared
        last page is copied on its first write, as always)."""
        with self.hold():
            keep = len(self._tokens) if n_tokens is None else n_tokens
            if isinstance(keep, bool) or not isinstance(keep, Integral) or not 0 <= keep <= len(self._tokens):
                raise ContextError(f"cannot fork the first {keep!r} tokens (n_tokens: an int in [0, {self.n_tokens}])")
            kv = self._kv
            seq = kv.seq.fork()
            if seq.n_tokens > keep:
                seq = self._truncated(seq, keep)
            same_kv = seq.n_tokens == kv.seq.n_tokens  # then our last logits are the branch's too
            return self._table.adopt(name, seq, self._tokens[:keep], labels=self.labels,
                                     sampler_state=self.sampler_state,
                                     last_logits=kv.logits.copy() if same_kv and kv.logits is not None else None,
                                     snapshot_id=self.snapshot_id, lora=self.lora,
                                     constraint=forked_constraint(self._constraint, keep, len(self._tokens)))

    def rewind(self, n: int) -> None:
        """Drop the last n tokens (their pages are released or copied on write); the logits
        after the new last token are computed on next use. Refused, it changes nothing."""
        with self.hold():
            if isinstance(n, bool) or not isinstance(n, Integral) or not 0 <= n <= len(self._tokens):
                raise ContextError(f"cannot rewind {n!r} tokens of a {len(self._tokens)}-token context")
            keep = len(self._tokens) - n
            constraint = forked_constraint(self._constraint, keep, len(self._tokens), share=True)
            if self._kv.seq.n_tokens > keep:  # first: the one step that may be refused (no page for its copy)
                self._kv.set_kv(self._truncated(self._kv.seq, keep), None)
            self._constraint = constraint
            del self._tokens[keep:]

    def shares_kv_at(self, n_tokens: int) -> bool:
        """Whether a fork of the first n tokens reuses this context's KV. It does unless a sliding-window model
        has released KV that the window at n would need; such a fork recomputes the prefix instead."""
        with self.hold():  # a bad n_tokens (a float, a bool, out of range) is a RequestError naming it
            n, seq = checked_count(n_tokens, len(self._tokens), "n_tokens"), self._kv.seq
            return n >= seq.n_tokens or seq.can_truncate(n)

    def delete(self) -> None:
        """Delete it; ContextError if it was deleted already (even if a new one has its name)."""
        self._table.remove(self.name, only=self)

    # -- persistence ------------------------------------------------------------
    def snapshot(self, store, ref: str | None = None, *, labels: dict[str, str] | None = None) -> str:
        """Write this context to a snapshot store (only the pages it lacks); the snapshot id."""
        return self._table.snapshot(self, store, ref, labels)

    def constraint_state(self) -> dict | None:
        """The unfinished grammar, as a snapshot stores it (None: there is none)."""
        return stored_constraint(self._constraint)

    # -- internals --------------------------------------------------------------
    def _sync(self) -> np.ndarray | None:
        """Prefill the tokens whose KV is not computed yet; logits of the last token."""
        kv = self._kv
        if kv.state is not Residency.LIVE:
            self._resident()  # evicted while a stream of ours was suspended
        n_kv = kv.seq.n_tokens
        if n_kv >= len(self._tokens):
            if kv.logits is not None or not self._tokens:
                return kv.logits
            # Logits were dropped (rewind, restore): recompute the last position.
            kv.set_kv(self._truncated(kv.seq, n_kv - 1), None)
            n_kv = kv.seq.n_tokens
        # Room for its pages is made on this thread (evicting idle contexts, never this one) first.
        try:
            logits = self.engine.forward(kv.seq, self._tokens[n_kv:], reserve=self._reserve_pages, lora=self.lora)
        except BaseException:  # interrupted just after the step ran: its logits are not ours, so none are
            if kv.seq.n_tokens != n_kv:
                kv.set_kv(kv.seq, None)
            raise
        kv.computed(logits)
        return logits

    def _reserve_pages(self, n: int) -> "Promise":
        return self._table.reserve_pages(n, keep=self)  # held until the forward is done

    def _truncated(self, seq, n: int):
        """seq cut to n tokens, room for its copy-on-write page made first (residency.truncated)."""
        return truncated(seq, n, self._reserve_pages, self.engine.new_sequence)

    def _make_sampler(self, overrides: dict) -> Sampler:
        if not self._tokens:
            raise ContextError(f"context '{self.name}' is empty: append a prompt before generating")
        try:
            sampler = Sampler.continuing(self.sampler_state, overrides)
        except ValueError as err:
            raise ContextError(str(err)) from None
        self.engine.checked_ids(i for i, _ in sampler.params.logit_bias)  # named now, not at the first token
        return sampler

    def _check_room(self, n_new: int, bound: str = "") -> None:
        if len(self._tokens) + n_new > (n_ctx := self.engine.config.n_ctx):
            raise ContextError(f"context '{self.name}' would hold {bound}{len(self._tokens) + n_new} tokens; "
                               f"the model's context length is {n_ctx}")

    def _check_live(self) -> None:
        if self._speculation is not None:  # a generation paused between pieces: its drafts go
            self._speculation.settle()
        self._resident()
        if self._kv.seq.n_tokens > len(self._tokens):  # a step an interrupt cut off from its tokens
            self._kv.set_kv(self._truncated(self._kv.seq, len(self._tokens)), None)

    def _resident(self) -> None:
        """Read the context back if it is evicted; ContextError if it is deleted."""
        state = self._kv.state
        if state is Residency.EVICTED:
            self._table.bring_back(self)
        elif state is Residency.DELETED:
            raise ContextError(f"no context named '{self.name}' (it was deleted)")  # 404 on the faces
        self._kv.require_live()  # EVICTING here: a use that skipped the lock the writer holds

    # Read-only views of the KV state (page table, last logits, snapshot while evicted), for tests.
    _seq = property(lambda self: self._kv.seq)
    _last_logits = property(lambda self: self._kv.logits)
    _evicted = property(lambda self: self._kv.snapshot)
