"""Continuous batching: one loop thread per model runs every pending forward
request together, one native step at a time.

Each step takes the next token of every decoding sequence first, then chunks
of pending prompts, oldest first, up to a token budget; a long prompt is split
over several steps so streams already decoding keep getting tokens. The native
forward reads each weight once for all rows of a step, and each row's result
is bit-identical to running its sequence alone, so batching changes speed only.
Callers block on their request; sequences join and leave between steps.

A step reads as three calls (``step``)::

    batch = self.schedule()          # who runs now; new requests are admitted
    errors = self.forward(batch)     # one native step over every row
    self.postprocess(batch, errors)  # count, hand results back, finish requests

Room for a request's KV pages is made before it is queued, on the caller's
thread: its ``reserve`` (the context table's, which may evict idle contexts to
the snapshot store) is called once, with the pages its tokens may take. So the
loop never waits on the store (an eviction's write holds up only the request
that needs its pages), nor calls back up into the layers above, and a request
whose pages cannot be found fails before any of its KV is written.

A caller may also give up on its requests (``cancelled_when``): a long prompt
whose client has gone stops between two steps instead of running to its end.
A caller interrupted while it waits (Ctrl-C: KeyboardInterrupt) gives its
request up the same way, and ``submit`` returns only once no step runs it,
with the sequence's KV as it was: it either ran, or left nothing behind.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import numpy as np

from ..errors import CancelledError
from .step_cost import StepCost
from .step_request import Request, interrupts_deferred

DEFAULT_STEP_TOKENS = 256
# How long a step waits for streams that decoded in the last one to send their
# next token (they are sampling it): without it every other step would run
# without them. Only when some are missing; a submit ends the wait at once.
REJOIN_WAIT_S = 0.003


# Make room for this many more KV pages, or raise; called on the requesting thread. It
# may return a release, called once the request has run (its pages taken) or failed.
Reserve = Callable[[int], Callable[[], None] | None]


# The give-up test of the forward requests this thread makes (None: they run to their end).
_give_up: ContextVar[Callable[[], bool] | None] = ContextVar("ctxengine_give_up", default=None)


@contextmanager
def cancelled_when(check: Callable[[], bool]) -> Iterator[None]:
    """Forward requests made on this thread inside the block (a context's append,
    an embedding) end early once ``check()`` is true: it is asked before each of
    their steps, from the scheduler's thread, so it must be quick and thread-safe
    (``threading.Event.is_set``). A request so ended raises CancelledError and
    leaves its sequence's KV as it was before it."""
    token = _give_up.set(check)
    try:
        yield
    finally:
        _give_up.reset(token)


def pages_needed(seq, n_tokens: int, page_tokens: int) -> int:
    """New pages n_tokens more fill on seq, plus one for copying its last page before writing
    it when that page is partly filled and shared (a fork's). Only a forward on seq changes
    that, and seq's forwards run one at a time (its context's lock), so the count holds
    until the forward takes its pages. (One more page, always, left a pool's last unused.)"""
    pages = seq.pages
    copy = bool(pages) and seq.n_tokens % page_tokens != 0 and seq.pool.refcount(pages[-1]) > 1
    return -(-(seq.n_tokens + n_tokens) // page_tokens) - len(pages) + copy


class Scheduler:
    """Batches forward requests from any number of threads into shared steps."""

    def __init__(self, core, *, n_ctx: int, n_vocab: int, page_tokens: int,
                 step_tokens: int = DEFAULT_STEP_TOKENS):
        if step_tokens < 1:
            raise ValueError("step_tokens must be at least 1")
        self._core = core
        self.n_ctx, self.n_vocab, self.step_tokens = n_ctx, n_vocab, step_tokens
        self.page_tokens = page_tokens
        # Decode rows may not take the whole budget while a prompt waits, so it never starves.
        self._prefill_reserve = max(1, step_tokens // 8)
        self._cv = threading.Condition()
        self._queue: list[Request] = []  # in submission order; only the loop removes
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False          # a step is running (on the loop or inline on a caller)
        self._last_seqs: set = set()  # ids of the sequences in the last step
        self._decoded: set = set()    # ids of those that decoded a token in it
        self.steps = 0                            # native steps run
        self.rows = 0                             # tokens those steps ran (every row, decode and prompt)
        self.history: deque = deque(maxlen=4096)  # (decode rows, prefill rows) of recent steps
        self.step_cost = StepCost()               # seconds of a decode-only step per row count

    @property
    def n_queued(self) -> int:
        """Forward requests waiting for a step (a lone stream runs inline and never waits)."""
        with self._cv:
            return len(self._queue)

    @property
    def crowd(self) -> int:
        """Sequences in the last step (speculation drafts less when rows are not free)."""
        return len(self._last_seqs)

    # -- callers --------------------------------------------------------------
    def submit(self, seq, tokens: np.ndarray, logits, all_logits: bool, hidden,
               reserve: Reserve | None = None, *, lora: list | None = None, decode: bool = False) -> None:
        """Run tokens on seq in some coming step(s), filling logits / hidden; blocks until done.
        ``reserve(n_pages)`` makes room in the page pool first, on this thread (the release
        it may return is called when the request is done);
        ``lora``: the sequence's [(native adapter, scale)], rows of other sequences
        in the same step may have other adapters or none.
        ``decode``: a stream's token and its drafts, scheduled as a decode row, not a prompt."""
        if len(tokens) > self.step_tokens:
            self._check(seq, tokens)  # before the first chunk, so a refused prompt leaves no KV behind
        give_up = _give_up.get()  # read on the caller's thread: the scheduler's has its own context
        if give_up is not None and give_up():
            raise CancelledError("the request was cancelled before it ran")
        # Room is made here, on the caller's thread: it may write evictions to the store.
        release = reserve(pages_needed(seq, len(tokens), self.page_tokens)) if reserve is not None else None
        try:
            self._run(Request(seq, tokens, logits, all_logits, hidden, lora, decode, give_up))
        finally:
            if release is not None:
                release()

    def _run(self, req: Request) -> None:
        """Queue the request (or run its step here when it is alone) and wait for it."""
        seq, tokens = req.seq, req.tokens
        with self._cv:
            if self._closed:
                raise RuntimeError("the model is closed")
            # A lone stream (the last step was its own, nothing is queued or running) runs
            # its step on its own thread: no hand-off to the loop and back.
            inline = (not self._queue and not self._busy and len(tokens) <= self.step_tokens
                      and self._last_seqs <= {id(seq)})
            if inline:
                self._busy = True
            else:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="ctxengine-scheduler", daemon=True)
                    self._thread.start()
                self._queue.append(req)
                self._cv.notify()
        if inline:
            with interrupts_deferred() as interrupts:
                batch = self._admit([(req, len(tokens))])
                with self._stepping(batch):
                    errors = self.forward(batch)
                    self.postprocess(batch, errors)
            if interrupts:
                self._undo(req)
                raise KeyboardInterrupt
        else:
            try:
                req.wait()
            except BaseException:  # interrupted: give the request up, and wait until no step runs it
                req.interrupted = True
                with self._cv:
                    self._cv.notify()
                req.wait_out()
                self._undo(req)
                raise
        if req.error is not None:
            raise req.error

    @staticmethod
    def _undo(req: Request) -> None:
        """An interrupted caller's request that ran to its end all the same: its KV put back
        (one that failed or was given up has been put back already)."""
        if req.error is None and req.seq.n_tokens > req.start:
            req.seq.truncate(req.start)

    def close(self) -> None:
        """Refuse new requests, finish what is queued and the step running on a caller's
        thread (a lone stream's), then stop the loop thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
            if thread is not threading.current_thread():
                while self._busy or self._queue:  # a step's end wakes us; a given-up request's drop may not
                    self._cv.wait(0.05)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _check(self, seq, tokens: np.ndarray) -> None:
        # The native forward's own checks and messages, for prompts it will only see in chunks.
        total = seq.n_tokens + len(tokens)
        if total > self.n_ctx:
            raise ValueError(f"context length exceeded: {total} tokens > {self.n_ctx}")
        bad = tokens[(tokens < 0) | (tokens >= self.n_vocab)]
        if len(bad):
            raise IndexError(f"token id {int(bad[0])} outside the vocabulary")

    # -- the step -------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            batch = self.schedule()
            if batch is None:
                return
            if not batch:  # every queued request was given up
                continue
            with self._stepping(batch):
                errors = self.forward(batch)
                self.postprocess(batch, errors)
            # Not held while waiting for the next step: a sequence whose caller has
            # let go of it (a deleted context) gives its pages back now.
            batch = errors = None

    @contextmanager
    def _stepping(self, batch: list[tuple[Request, int]]):
        """Around a step's forward and postprocess: whatever happens, no caller of
        the batch is left waiting, and the next step may begin."""
        try:
            yield
        except BaseException as err:  # a bug here must not leave callers waiting forever
            for r, _ in batch:
                if not r.finished:
                    r.finish(err)
        finally:
            with self._cv:
                self._busy = False
                self._queue = [r for r in self._queue if not r.finished]
                if self._queue or self._closed:  # the next step, or a close waiting for this one
                    self._cv.notify_all()

    def schedule(self) -> list[tuple[Request, int]] | None:
        """Wait for work, then this step's (request, tokens), new requests admitted;
        [] when every queued request was given up; None once closed with nothing left to run."""
        with self._cv:
            while self._busy or not (self._queue or self._closed):
                self._cv.wait()
            self._drop_abandoned()
            if not self._queue:
                return None if self._closed else []
            self._await_decoders()
            self._busy = True
            return self._admit(self._plan())

    def forward(self, batch: list[tuple[Request, int]]) -> list[BaseException | None]:
        """One native step over the batch; each item's error (None: it ran)."""
        if not batch:
            return []
        items = [r.item(n) for r, n in batch]
        try:
            start = time.perf_counter()
            self._core.forward(items)
            if all(r.decode and r.done == 0 and n == len(r.tokens) for r, n in batch):  # logits on every row
                self.step_cost.observe(sum(n for _, n in batch), time.perf_counter() - start)
            return [None] * len(batch)
        except Exception as err:
            # The native step checks every item before touching any KV and undoes
            # a failed step, so each item can be rerun alone to find whose it was.
            return [err] if len(items) == 1 else [self._alone(item) for item in items]

    def postprocess(self, batch: list[tuple[Request, int]], errors: list[BaseException | None]) -> None:
        """Count the step, then finish each request that is done or failed."""
        if not batch:
            return
        self.steps += 1
        self.rows += sum(n for _, n in batch)
        self._last_seqs = {id(r.seq) for r, _ in batch}
        decodes = [r for r, n in batch if r.done == 0 and n == len(r.tokens) and r.decode]
        self._decoded = {id(r.seq) for r in decodes}
        n_decode = sum(len(r.tokens) for r in decodes)
        self.history.append((n_decode, sum(n for _, n in batch) - n_decode))
        for (r, n), err in zip(batch, errors):
            if err is not None:
                if r.seq.n_tokens > r.start:
                    r.seq.truncate(r.start)  # undo its earlier chunks
                r.finish(err)
            else:
                r.done += n
                if r.remaining == 0:
                    r.finish()

    # -- inside schedule ------------------------------------------------------
    def _drop_abandoned(self) -> None:
        """Finish the queued requests whose callers gave up, their KV put back
        where it was before their first step (between steps: none is running)."""
        for r in self._queue:
            if r.abandoned():
                if r.done > 0 and r.seq.n_tokens > r.start:
                    r.seq.truncate(r.start)
                r.finish(CancelledError(f"the request was cancelled after {r.done} of its {len(r.tokens)} tokens"))
        self._queue = [r for r in self._queue if not r.finished]

    def _await_decoders(self) -> None:
        deadline = time.monotonic() + REJOIN_WAIT_S
        while not self._closed and self._decoded - {id(r.seq) for r in self._queue}:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cv.wait(left)
        self._decoded = set()

    def _plan(self) -> list[tuple[Request, int]]:
        """This step's (request, tokens): decode rows first, then prompt chunks FIFO."""
        heads, seen = [], set()
        for r in self._queue:  # one request per sequence per step, the oldest
            if id(r.seq) not in seen:
                seen.add(id(r.seq))
                heads.append(r)
        decodes = [r for r in heads if r.decode and r.done == 0]
        prefills = [r for r in heads if not (r.decode and r.done == 0)]
        cap = self.step_tokens - (self._prefill_reserve if prefills else 0)
        plan, rows = [], 0
        for r in decodes:  # whole: a stream's token and its drafts run in one step
            if plan and rows + r.remaining > cap:
                break
            plan.append((r, r.remaining))
            rows += r.remaining
        left = self.step_tokens - rows
        for r in prefills:
            if left <= 0:
                break
            n = min(r.remaining, left)
            plan.append((r, n))
            left -= n
        return plan

    @staticmethod
    def _admit(planned: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """The planned items, a request's first chunk admitting it: where its KV
        goes back to if a later chunk fails (its pages were reserved when it was submitted)."""
        for r, n in planned:
            if r.done == 0:
                r.start = r.seq.n_tokens
        return planned

    def _alone(self, item: tuple) -> BaseException | None:
        try:
            self._core.forward([item])
        except Exception as err:
            return err
        return None
