"""The one path every generation takes, whatever face and dialect asked for
it: request -> prompt ids -> prefix reuse -> a stream of typed events
(serving/events.py) -> the face's writer for its reply shape (HTTP:
api/streaming.py).

Each generation runs on a thread of its own from the lease of its model to
its end (a context's lock belongs to the thread that took it, and the model's
scheduler batches whatever threads are stepping at the same time), and hands
its events to the request's event loop: first :class:`Started` (after the
prompt is prefilled, so a refused prompt is still an error reply), then
:class:`Text` pieces, then :class:`Finished` (or :class:`Failed`). When tools
are offered the reply is split here, as it is generated: text that may be a
tool call is held back, and the calls come parsed in Finished. ``cancel()``
(a client that went away, a server shutting down) stops it after the current
token, and the context's generator is closed on its own thread, releasing its lock.

Failures are the errors raised, as raised (a CtxError for what the request
asked wrongly, anything else a bug); each face reports them in its own terms
(api/errors.py's ``as_api_error``). What the faces state in their own wire
terms comes in ready-made: the request's :class:`Sampling` and
:class:`ToolUse`, and ``entry_defaults``, how an entry's params layer reads
as Sampling (Ollama's option names: the face that parses them supplies it).

A request that names no context goes through the model's prefix cache
(``ctxengine.serving.prefix_cache``): only the tokens past the longest prefix
shared with a recent request are prefilled. A request with ``context``
continues that named context: only the new turns are rendered and appended.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable

from ..engine.scheduler import cancelled_when
from ..errors import ContextError, CtxError, RequestError
from ..store.names import validate_name
from ..text.lazy_calls import LazyCalls
from ..text.tool_stream import ToolStream
from ..text.tools import ToolUse, forced_call_grammar, tool_format
from .events import Event, Failed, Finished, Started, Text
from .generate import Sampling
from .prompts import Prompt, continuation_ids, continuation_spans, continuation_text, prompt_ids, reply_room

if TYPE_CHECKING:
    from ..engine.model_source import CatalogEntry
    from ..text.grammar import Grammar
    from .runtime import Runtime

__all__ = ["Failed", "Finished", "GenerationRequest", "Generation", "Generations", "Started", "Text", "UNSET"]

UNSET = object()  # a request that leaves keep_alive as it is
_request_names = itertools.count(1)


@dataclass
class GenerationRequest:
    model: str | None
    prompt: Prompt
    sampling: Sampling = field(default_factory=Sampling)
    context: str | None = None        # a named context to continue (our extension)
    keep_alive: object = UNSET        # Ollama: seconds to stay loaded afterwards (None: forever)
    grammar: "Grammar | None" = None  # constrains the reply (api/structured.py builds it)
    tools: ToolUse | None = None      # tools offered; a forced choice is grammar-constrained (text/tools.py)
    lora: list | None = None          # [{"id" | "name", "scale"}] (serving/lora.py); None: the model's scales
    own_context: bool = False         # ``context`` is the server's own (the Responses API's), not a client's

    def __post_init__(self):
        ka = self.keep_alive
        if not (ka is UNSET or ka is None or (isinstance(ka, (int, float)) and not isinstance(ka, bool))):
            raise TypeError(f"keep_alive must be UNSET, None or seconds, not {ka!r}")
        if self.context is not None:
            validate_name(self.context, "context")  # "../x" is a bad name (400), not an unknown one (404)


class Generations:
    """Starts generations and keeps track of those running (for shutdown)."""

    def __init__(self, runtime: "Runtime", metrics=None, request_timeout: float | None = None,
                 entry_defaults: "Callable[[CatalogEntry], Sampling] | None" = None):
        self.runtime = runtime
        self.entry_defaults = entry_defaults  # an entry's default sampling (None: the engine's)
        self.metrics = metrics
        self.request_timeout = request_timeout  # seconds a generation may run (None: no limit)
        self._active: set[Generation] = set()
        self._lock = threading.Lock()

    async def start(self, request: GenerationRequest) -> "Generation":
        """A running generation whose prompt is prefilled; the error that refused it, raised."""
        entry = self.runtime.resolve(request.model)
        defaults = self.entry_defaults(entry) if self.entry_defaults is not None else Sampling()
        sampling = request.sampling.over(defaults).checked()
        gen = Generation(self, entry, request, sampling)
        with self._lock:
            self._active.add(gen)
        await gen._start()
        return gen

    def _done(self, gen: "Generation") -> None:
        with self._lock:
            self._active.discard(gen)

    def cancel_all(self) -> None:
        """Stop every running generation after its current token (each still finishes its reply)."""
        with self._lock:
            active = list(self._active)
        for gen in active:
            gen.cancel()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel every running generation and wait (bounded) for their threads."""
        with self._lock:
            active = list(self._active)
        self.cancel_all()
        deadline = time.monotonic() + timeout
        for gen in active:
            gen._thread.join(max(0.0, deadline - time.monotonic()))


class Generation:
    def __init__(self, owner: Generations, entry: "CatalogEntry", request: GenerationRequest, sampling: Sampling):
        self.entry = entry
        self.request = request
        self.sampling = sampling
        self.started: Started | None = None
        self._owner = owner
        self._runtime = owner.runtime
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self._gone = threading.Event()  # nobody waits for it any more (abandon)
        self._thread = threading.Thread(target=self._run, name="ctx-generation", daemon=True)
        self._timer: asyncio.TimerHandle | None = None

    @property
    def metrics(self):
        return self._owner.metrics

    # -- the request's side (event loop) ------------------------------------------------
    async def _start(self) -> None:
        if self._owner.request_timeout is not None:  # ends like a cancel: cut short, "length"
            self._timer = self._loop.call_later(self._owner.request_timeout, self.cancel)
        self._thread.start()
        try:
            event = await self._queue.get()
        except asyncio.CancelledError:  # whoever waited for it is gone
            self.abandon()
            raise
        except BaseException:
            self.cancel()
            raise
        if isinstance(event, BaseException):
            raise event
        self.started = event

    async def events(self) -> AsyncIterator[Event]:
        """Text pieces, then Finished or Failed; stopping early cancels the generation."""
        try:
            while True:
                event = await self._queue.get()
                if isinstance(event, BaseException):
                    yield Failed(event)
                    return
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            self.cancel()
            if self._timer is not None:
                self._timer.cancel()

    async def collect(self) -> Finished:
        """The events folded into the whole reply (its text and calls are in
        Finished); a failure is raised."""
        async for event in self.events():
            if isinstance(event, Failed):
                raise event.error
            if isinstance(event, Finished):
                return event
        raise RuntimeError("the generation ended without finishing")

    def cancel(self) -> None:
        self._cancel.set()

    def abandon(self) -> None:
        """Cancel it before it begins: one still waiting its turn on a busy context
        then leaves the context untouched (a cancelled one that has begun still
        closes its turn)."""
        self._gone.set()
        self._cancel.set()

    # -- the generation's side (its own thread) -------------------------------------------
    def _emit(self, event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            self._cancel.set()

    def _run(self) -> None:
        t0 = time.perf_counter_ns()
        try:
            with self._runtime.lease(self.entry.name) as model:
                load_ns = time.perf_counter_ns() - t0
                if self.request.context is not None:
                    self._continue_named(model, load_ns, t0)
                else:
                    self._run_fresh(model, load_ns, t0)
            if self.request.keep_alive is not UNSET:
                self._runtime.keep_alive(self.entry.name, self.request.keep_alive)
        except BaseException as err:  # every failure reaches the client, as its face reports it
            self._emit(err)
        finally:
            self._owner._done(self)

    def _lora(self):
        """The adapters this request runs with (a RequestError for a bad ``lora`` field)."""
        return self._runtime.loras(self.entry.name).for_request(self.request.lora)

    def _same_weights(self, ctx, model) -> bool:
        """Whether a context held by another served name runs as this request's model would:
        the same weights and the same adapters (two names for one file, say, a snapshot
        restored under the first of them). Its own engine then goes on with it."""
        return ctx.engine.weight_id == model.engine.weight_id and ctx.lora == self._lora()

    def _run_fresh(self, model, load_ns: int, t0: int) -> None:
        if self._gone.is_set():
            raise RequestError("the client went away before the generation began")
        limit = self._limit(model)
        room = reply_room(limit, self.sampling.max_tokens)  # what a trimmed chat leaves its reply
        ids = prompt_ids(model, self.entry, self.request.prompt, limit, room)
        if len(ids) >= limit:
            raise ContextError(f"the prompt is {len(ids)} tokens; the context length is {limit}")
        lora = self._lora()
        cache = self._runtime.prefix_cache(self.entry.name)
        if cache is not None:
            ctx, cached = cache.acquire(ids, lora)
        else:
            ctx, cached = model.contexts.adopt(f"_request/{next(_request_names)}", model.engine.new_sequence(), (),
                                               lora=lora), 0
        ok = False
        try:
            t = time.perf_counter_ns()
            with cancelled_when(self._gone.is_set):  # a client gone during a long prompt stops it
                ctx.append(ids[cached:])
            self._started(Started(self.entry.name, len(ids), cached, load_ns, time.perf_counter_ns() - t))
            finished = self._decode(model, ctx, limit, t0)
            ok = True
        finally:
            if cache is not None:
                cache.release(ctx, keep=ok)
            else:
                ctx.delete()
        # Told only now, when the cache holds this request's context: a client's next turn,
        # sent the moment this reply arrives, finds it there.
        self._finish(finished)

    def _continue_named(self, model, load_ns: int, t0: int) -> None:
        with self._runtime.hold_context(self.request.context, client=not self.request.own_context) as ctx:
            if self._gone.is_set():  # abandoned while it waited for the context: append nothing
                raise RequestError("the client went away before the context was free")
            if ctx.engine is not model.engine and not self._same_weights(ctx, model):
                owner = self._runtime.loaded_entry_of(ctx)
                raise RequestError(f"context '{ctx.name}' belongs to model "
                                   f"'{owner.entry.name if owner is not None else ctx.engine.name}', "
                                   f"not '{self.entry.name}'")
            if self.request.lora is not None and (asked := self._lora()) != ctx.lora:
                raise RequestError(f"context '{ctx.name}' runs with {ctx.lora.describe()}; a request cannot "
                                   f"change its adapters (this one asks for {asked.describe()})", param="lora")
            cached, before = ctx.n_cached, ctx.n_tokens
            text = continuation_text(model, self.entry, self.request.prompt, ctx.tokens)
            plain = continuation_spans(model, self.entry, self.request.prompt, ctx.tokens, text)
            t = time.perf_counter_ns()
            ids = continuation_ids(ctx, text, self._limit(model), plain)  # refused past the limit: nothing appended
            if ids:
                with cancelled_when(self._gone.is_set):  # stopped, the context is left as it was
                    ctx.append(ids)
            self._started(Started(self.entry.name, ctx.n_tokens, cached, load_ns, time.perf_counter_ns() - t))
            prompted = ctx.n_tokens
            try:
                finished = self._decode(model, ctx, self._limit(model), t0)
            except BaseException as err:
                if isinstance(err, Exception) and ctx.n_tokens == prompted:
                    # refused before a token (its grammar, its sampler): the turn goes too, so
                    # that a refused request leaves the context as it was; where a full pool has
                    # no page for the rewind's copy, the turn stays and the refusal is still
                    # what the client hears
                    with contextlib.suppress(ContextError):
                        ctx.rewind(ctx.n_tokens - before)
                else:
                    self._close_turn(model, ctx)
                raise
            self._close_turn(model, ctx)
            self._runtime.turn_done(ctx)  # in a fleet: published, so any host continues it
            finished.tokens = ctx.tokens
            self._finish(finished)

    def _close_turn(self, model, ctx) -> None:
        """End the reply's chat turn (what the template writes after it), where it fits."""
        if self.request.prompt.is_chat:
            closing = model.chat.render(after=ctx.tokens, closing=True, generation_prompt=False,
                                        template_kwargs=self.request.prompt.template_kwargs)
            try:
                if closing:
                    ctx.append(closing, parse_special=True)
            except CtxError:
                pass  # the context is full: the turn stays open, nothing is lost

    def _started(self, started: Started) -> None:
        self.started = started
        self._emit(started)

    def _limit(self, model) -> int:
        n_ctx = model.config.n_ctx
        return min(n_ctx, self.sampling.num_ctx) if self.sampling.num_ctx else n_ctx

    def _finish(self, finished: Finished) -> None:
        if self.metrics is not None:
            self.metrics.generation(self.started, finished)
        self._emit(finished)

    def _decode(self, model, ctx, limit: int, t0: int) -> Finished:
        """Generate into ctx, streaming the text; how it ended."""
        s = self.sampling
        n0 = ctx.n_tokens
        room = max(0, limit - n0)
        max_tokens = room if s.max_tokens is None else min(s.max_tokens, room)
        t = time.perf_counter_ns()
        parts: list[str] = []
        shown: list[str] = []  # the text the stream showed: the reply's text, streamed or not
        use, grammar = self.request.tools, self._grammar(model)
        # Calls are split out of a reply (free, forced, or under the caller's own GBNF); under a
        # JSON response format the reply is the format's (no call can be made), and a JSON
        # reply (a schema, a forced call) is not cut by stop strings: it always parses.
        formatted = self.request.grammar is not None and self.request.grammar.is_json
        split = (ToolStream(forced=use.choice.forced, names=use.names)
                 if use is not None and use.parses and (use.choice.forced or not formatted) else None)
        stops = [] if grammar is not None and grammar.is_json else s.stop
        # A call the model begins of its own accord is constrained from its tag (text/lazy_calls.py).
        calls = LazyCalls.offered(use.tools, tool_format(model.chat_template), model.tokenizer,
                                  single=not use.parallel) if split is not None and grammar is None else None
        pieces = ctx.generate(max_tokens, stop=stops, grammar=grammar, speculative=s.speculative, calls=calls,
                              **s.params)
        sampled = self.metrics.sampled_tokens.labels(self.entry.name) if self.metrics is not None else None
        counted = 0
        try:
            for piece in pieces:
                if piece.token_id is not None and sampled is not None:
                    sampled.inc()
                    counted += 1
                if piece.text:
                    parts.append(piece.text)
                    shown.append(self._text(split.push(piece.text) if split is not None else piece.text))
                if self._cancel.is_set():
                    break
        finally:
            pieces.close()  # on this thread: releases the context's lock
        now = time.perf_counter_ns()
        reply, calls = "".join(parts), []
        if split is not None:
            rest, calls = split.finish()  # the held text that was no call, and the calls
            shown.append(self._text(rest))
            if not use.parallel:
                calls = calls[:1]
        text = "".join(shown)
        new = ctx.tokens[n0:]
        if sampled is not None and len(new) > counted:
            sampled.inc(len(new) - counted)  # those no piece carried: the end of turn a reply ends with
        stop = None
        if ctx.finish_reason == "stop" and new and new[-1] not in model.tokenizer.eog_ids:
            stop = _which_stop(model.detokenize(new), reply, stops)
        return Finished(ctx.finish_reason or "length", stop, len(new), now - t, now - t0, ctx.tokens,
                        ctx.speculation.drafted, ctx.speculation.accepted, text, calls)

    def _text(self, text: str) -> str:
        if text:
            self._emit(Text(text))
        return text

    def _grammar(self, model):
        """The request's grammar; for a forced tool call, one that makes the call parse."""
        use = self.request.tools
        if use is not None and use.choice.forced:
            return forced_call_grammar(use.tools, use.choice, tool_format(model.chat_template))
        return self.request.grammar


def _which_stop(decoded: str, emitted: str, stops: list[str]) -> str | None:
    """The stop string that ended a reply: the one right after the emitted text."""
    at = decoded[len(emitted):] if decoded.startswith(emitted) else decoded
    return next((x for x in stops if at.startswith(x)), next((x for x in stops if x in decoded), None))
