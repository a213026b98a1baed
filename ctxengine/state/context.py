"""A live, named context: token ids, a KV page table, sampler state, labels.

A context's KV may lag its tokens: tokens sampled by ``generate`` are kept and
prefilled on the next step that needs them (``_sync``), so a stream never
pays a forward pass for a token nobody reads the logits of.

A generation under a grammar (``generate(grammar=...)`` or ``json_schema=``)
leaves its constraint in the context while the output is unfinished (cut by
max_tokens): the next ``generate()`` without a grammar continues it, a fork
forks it, a snapshot stores it and a restore replays it (see
text/grammar.py). Appending ends it: appended text is the caller's, not the
grammar's.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ..errors import ContextError
from . import conversation
from ..text.closing import Closer
from ..text.grammar import Constraint, Grammar, as_grammar
from ..engine.lora import NO_LORA, LoraSet
from ..engine.sampler import Sampler, SamplerParams, StopMatcher
from ..engine.speculative import SpeculationStats
from .speculation import Speculation, default_drafter
from ..text.tokenizer import StreamDecoder

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from .table import ContextTable


@dataclass(frozen=True)
class Piece:
    """One step of a stream. ``token_id`` is None only for a final piece that
    carries text held back until the end (an incomplete UTF-8 sequence or a
    possible start of a stop string)."""

    text: str
    token_id: int | None


class Context:
    def __init__(self, table: "ContextTable", name: str, seq, tokens: Sequence[int] = (), *,
                 labels: dict[str, str] | None = None, sampler_state: dict | None = None,
                 last_logits: np.ndarray | None = None, snapshot_id: str | None = None,
                 constraint: "Constraint | dict | None" = None, lora: LoraSet = NO_LORA):
        self._table = table
        self.name = name
        self._seq = seq
        self._tokens = list(tokens)
        self._last_logits = last_logits     # logits after tokens[: seq.n_tokens]
        self.labels = dict(labels or {})
        self.sampler_state = sampler_state  # of the last generate(); continues its RNG
        self.finish_reason: str | None = None
        # The snapshot this context was restored from or last snapshotted to:
        # the parent of its next snapshot.
        self.snapshot_id = snapshot_id
        # Set while the table has written this context to its store to free
        # pages (see ContextTable.reserve_pages); it comes back on next use.
        self._evicted: str | None = None
        # The unfinished grammar of the last generation: live, or as a stored
        # state (a restore) that is replayed when a generation first needs it.
        self._constraint = constraint
        # The LoRA adapters and scales its KV is computed with: fixed for its
        # life (a context never holds KV made under two adapter sets).
        self.lora = lora
        # The running generation's speculation (its drafts' KV may lie past our
        # tokens until it settles), and the drafted/accepted counts of the last one.
        self._speculation: Speculation | None = None
        self.speculation = SpeculationStats()
        self._lock = threading.RLock()

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
    def n_cached(self) -> int:
        """Tokens whose KV is computed (the rest are prefilled on next use)."""
        with self._lock:
            self._check_live()
            return self._seq.n_tokens

    def page_ids(self) -> list[int] | None:
        """Ids of the KV pages this context holds in its model's pool (forks share
        them until one writes; empty while evicted), or None while another thread
        uses it: its page table may be growing then, so it is not read."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return list(self._seq.pages) if self._seq is not None else []
        finally:
            self._lock.release()

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
        with self._lock:
            self._check_live()
            if isinstance(content, str):
                ids = self.engine.tokenize(content, parse_special=parse_special)
                if not self._tokens:
                    ids = self.engine.tokenizer.with_bos(ids)
            else:
                ids = [int(i) for i in content]
                bad = [i for i in ids if not 0 <= i < self.engine.config.n_vocab]
                if bad:
                    raise ContextError(f"token id {bad[0]} is outside the vocabulary (0..{self.engine.config.n_vocab - 1})")
            self._check_room(len(ids))
            self._constraint = None
            self._tokens.extend(ids)
            self._sync()
            self._table.touch(self)
            return len(ids)

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
        """Add a system message: rendered with the model's chat template when it
        has one (its control tokens parsed), else as plain text."""
        if self.engine.chat_template is None:
            return self.append(text)
        turn = [{"role": "system", "content": text}]
        return self.append(self.engine.chat.render(turn, generation_prompt=False), parse_special=True)

    def generate(self, max_tokens: int = 256, *, stop: Sequence[str] = (), grammar: "Grammar | str | None" = None,
                 json_schema=None, close_json: bool = True, speculative=None, **sampling) -> Iterator[Piece]:
        """Stream up to max_tokens sampled tokens as pieces of text.

        Sampling options are SamplerParams fields (temperature, top_k, top_p,
        min_p, repeat_penalty, presence_penalty, frequency_penalty, seed). With
        no seed, the RNG continues from this context's last generation, so a
        restored context goes on exactly as the original would.

        ``grammar`` (GBNF text or a Grammar) or ``json_schema`` (a dict or its
        JSON text) constrain the output; it ends ("stop") when the grammar is
        complete, or ("length") unfinished, and then a later generate()
        without a grammar continues it. Under a JSON grammar (a schema, a
        forced tool call) ``close_json`` steers the output to close within
        max_tokens whenever its shortest completion fits (text/closing.py);
        ``close_json=False`` cuts it where max_tokens falls, to continue later.

        ``speculative``: verify drafted tokens several to a forward (state/speculation.py);
        the output is the same bits either way. None: the model's default (on); False: off;
        or a draft source (an object with ``propose(tokens, k)``). ``self.speculation``
        counts the drafted and accepted tokens.
        """
        with self._lock:
            self._check_live()
            if max_tokens < 0:
                raise ContextError("max_tokens must be >= 0")
            sampler = self._make_sampler(sampling)
            constraint = self._start_constraint(as_grammar(grammar, json_schema))
            tok = self.engine.tokenizer
            closer = (Closer(constraint, tok, self._tokens[constraint.start:])
                      if close_json and constraint is not None and constraint.grammar.is_json else None)
            decoder = StreamDecoder(tok)
            matcher = StopMatcher(list(stop))
            self.finish_reason = "length"
            spec = self._speculation = self._start_speculation(speculative, max_tokens)
            try:
                for i in range(max_tokens):
                    if len(self._tokens) >= self.engine.config.n_ctx:
                        break
                    left = min(max_tokens - i, self.engine.config.n_ctx - len(self._tokens))
                    token = closer.next_token(left) if closer is not None else None
                    if token is None:
                        token = self._sample(sampler, constraint, spec)
                        if closer is not None and not closer.keep(token, left):
                            token = closer.next_token(left)
                    if constraint is not None:
                        constraint.advance(token)
                        if closer is not None:
                            closer.consumed(token)
                    self._tokens.append(token)
                    if token in tok.eog_ids:
                        self.finish_reason = "stop"
                        break
                    text, hit = matcher.push(decoder.push(token))
                    yield Piece(text, token)
                    if hit:
                        self.finish_reason = "stop"
                        return
                    if constraint is not None and constraint.done:
                        self.finish_reason = "stop"  # complete: only an end of turn could follow
                        break
                rest = matcher.push(decoder.flush())[0] + matcher.flush()
                if rest:
                    yield Piece(rest, None)
            finally:
                if spec is not None:
                    spec.settle()
                    self._speculation, self.speculation = None, spec.stats
                self.sampler_state = sampler.state()
                # A finished grammar is over; an unfinished one waits for the next generate().
                if constraint is not None and self.finish_reason == "stop":
                    constraint = None
                self._constraint = constraint
                self._table.touch(self)

    def _sample(self, sampler: Sampler, constraint: Constraint | None, spec: "Speculation | None") -> int:
        if constraint is not None:
            constraint.prefetch()  # the mask is computed while the forward pass runs
        logits = self._sync() if spec is None else spec.next_logits()
        if constraint is not None:
            logits = constraint.mask(logits)
        return sampler.sample(logits, self._tokens)

    # -- branching --------------------------------------------------------------
    def fork(self, name: str | None = None, *, n_tokens: int | None = None) -> "Context":
        """A new context sharing every KV page copy-on-write: O(pages), no KV copied.

        With ``n_tokens`` the branch holds only the first n tokens (a shared
        last page is copied on its first write, as always)."""
        with self._lock:
            self._check_live()
            keep = len(self._tokens) if n_tokens is None else n_tokens
            if not 0 <= keep <= len(self._tokens):
                raise ContextError(f"cannot fork the first {keep} tokens of a {len(self._tokens)}-token context")
            seq = self._seq.fork()
            if seq.n_tokens > keep:
                seq = self._truncated(seq, keep)
            same_kv = seq.n_tokens == self._seq.n_tokens  # then our last logits are the branch's too
            return self._table.adopt(name, seq, self._tokens[:keep], labels=self.labels,
                                     sampler_state=self.sampler_state,
                                     last_logits=self._last_logits.copy() if same_kv and self._last_logits is not None
                                     else None,
                                     snapshot_id=self.snapshot_id, constraint=self._forked_constraint(keep),
                                     lora=self.lora)

    def rewind(self, n: int) -> None:
        """Drop the last n tokens (their pages are released or copied on write)."""
        with self._lock:
            self._check_live()
            if not 0 <= n <= len(self._tokens):
                raise ContextError(f"cannot rewind {n} tokens of a {len(self._tokens)}-token context")
            keep = len(self._tokens) - n
            self._constraint = self._forked_constraint(keep, share=True)
            del self._tokens[keep:]
            if self._seq.n_tokens > keep:
                self._seq = self._truncated(self._seq, keep)
                self._last_logits = None
            self._sync()

    def shares_kv_at(self, n_tokens: int) -> bool:
        """Whether a fork of the first n tokens reuses this context's KV. It
        does unless a sliding-window model has released KV that the window at
        n would need; such a fork recomputes the prefix instead."""
        with self._lock:
            self._check_live()
            return 0 <= n_tokens <= len(self._tokens) and (n_tokens >= self._seq.n_tokens
                                                           or self._seq.can_truncate(n_tokens))

    def delete(self) -> None:
        self._table.remove(self.name)

    # -- persistence ------------------------------------------------------------
    def snapshot(self, store, ref: str | None = None, *, labels: dict[str, str] | None = None) -> str:
        """Write this context to a snapshot store (only the pages it lacks); the snapshot id."""
        from .snapshots import snapshot

        return snapshot(self, store, ref=ref, labels=labels)

    def constraint_state(self) -> dict | None:
        """The unfinished grammar, as a snapshot stores it (None: there is none)."""
        c = self._constraint
        return c.state() if isinstance(c, Constraint) else c

    # -- internals --------------------------------------------------------------
    def _start_constraint(self, grammar: Grammar | None) -> Constraint | None:
        """A new grammar starts at the current end; without one, an unfinished one goes on."""
        if grammar is not None:
            return Constraint(grammar, self.engine.tokenizer, len(self._tokens))
        c = self._constraint
        if isinstance(c, dict):  # restored: replay the tokens consumed under it
            c = self._constraint = Constraint.from_state(c, self.engine.tokenizer, self._tokens)
        return c

    def _start_speculation(self, speculative, max_tokens: int) -> Speculation | None:
        if speculative is None:
            speculative = self.engine.speculative
        if speculative is False:
            self.speculation = SpeculationStats()
            return None
        return Speculation(self, default_drafter(self) if speculative is True else speculative, max_tokens)

    def _forked_constraint(self, keep: int, share: bool = False) -> "Constraint | dict | None":
        """The constraint of the first ``keep`` tokens (``share``: this one, rolled back)."""
        c = self._constraint
        if c is None:
            return None
        start = c.start if isinstance(c, Constraint) else c["start"]
        if keep < start:
            return None
        if isinstance(c, dict):
            return dict(c)  # replayed over the (shorter) tokens when next used
        if keep == len(self._tokens):
            return c if share else c.fork()
        return c.state()  # replayed over the first keep tokens when next used

    def _sync(self) -> np.ndarray | None:
        """Prefill the tokens whose KV is not computed yet; logits of the last token."""
        if self._seq is None:
            self._check_live()  # evicted while a stream of ours was suspended
        n_kv = self._seq.n_tokens
        if n_kv >= len(self._tokens):
            if self._last_logits is not None or not self._tokens:
                return self._last_logits
            # Logits were dropped (rewind, restore): recompute the last position.
            self._seq = self._truncated(self._seq, n_kv - 1)
            n_kv = self._seq.n_tokens
        # The scheduler makes room for the pages when it admits the forward (it may
        # evict idle contexts to the store then, never this one).
        self._last_logits = self.engine.forward(self._seq, self._tokens[n_kv:], reserve=self._reserve_pages,
                                                lora=self.lora)
        return self._last_logits

    def _reserve_pages(self, n: int) -> None:
        self._table.reserve_pages(n, keep=self)

    def _truncated(self, seq, n: int):
        """seq cut to its first n tokens; or, where a sliding-window model
        released KV the window at n needs, a new empty sequence (the caller
        prefills the tokens, which the deterministic kernels make bit-identical)."""
        if seq.can_truncate(n):
            seq.truncate(n)
            return seq
        return self.engine.new_sequence()

    def _make_sampler(self, overrides: dict) -> Sampler:
        if not self._tokens:
            raise ContextError(f"context '{self.name}' is empty: append a prompt before generating")
        unknown = set(overrides) - set(SamplerParams.__dataclass_fields__)
        if unknown:
            raise ContextError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        params = SamplerParams(**overrides)
        if params.seed is None and self.sampler_state is not None:
            return Sampler.from_state(self.sampler_state).with_params(params)
        return Sampler(params)

    def _check_room(self, n_new: int) -> None:
        n_ctx = self.engine.config.n_ctx
        if len(self._tokens) + n_new > n_ctx:
            raise ContextError(f"context '{self.name}' would hold {len(self._tokens) + n_new} tokens; "
                               f"the model's context length is {n_ctx}")

    def _check_live(self) -> None:
        if self._speculation is not None:  # a generation paused between pieces: its drafts go
            self._speculation.settle()
        if self._seq is None and self._evicted is not None:
            self._table.bring_back(self)
        if self._seq is None:
            raise ContextError(f"context '{self.name}' was deleted")

    def _release(self) -> None:
        self._seq = None
        self._last_logits = None
        self._evicted = None
