"""A forward request as the scheduler runs it (engine/scheduler.py), and Ctrl-C held
off while a step runs on the caller's own thread."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class Request:
    """Tokens to run on one sequence, and where their results go; its caller waits on it."""

    __slots__ = ("seq", "tokens", "logits", "all_logits", "hidden", "lora", "decode", "start", "done",
                 "error", "finished", "give_up", "interrupted", "_done")

    def __init__(self, seq, tokens, logits, all_logits, hidden, lora: list | None = None, decode: bool = False,
                 give_up: Callable[[], bool] | None = None):
        self.seq, self.tokens, self.logits, self.all_logits, self.hidden = seq, tokens, logits, all_logits, hidden
        self.lora = lora           # [(native adapter, scale)] of the sequence, or None
        # A decode step of a stream: one token, or one and its drafts (speculative decoding).
        self.decode = decode or len(tokens) == 1
        self.start = 0             # KV length before its first chunk, restored if it fails part way
        self.done = 0              # tokens already run
        self.error: BaseException | None = None
        self.finished = False
        self.give_up = give_up     # the caller's (cancelled_when)
        self.interrupted = False   # its caller was interrupted while it waited: given up too
        self._done = threading.Lock()  # held until the request finishes: the cheapest one-shot wake-up
        self._done.acquire()

    def finish(self, error: BaseException | None = None) -> None:
        self.error, self.finished = error, True
        self._done.release()

    def wait(self) -> None:
        self._done.acquire()

    def wait_out(self) -> None:
        """Wait for it to finish, through further interrupts: the caller must not go on
        while a step may still write the sequence's KV (at most one step's wait)."""
        while not self.finished:  # set before the release: an interrupt just after wait() took it
            try:
                self._done.acquire()
            except BaseException:  # a second Ctrl-C: the first is what the caller gets
                continue

    def abandoned(self) -> bool:
        """Whether its caller has given up on it (a check that fails counts as yes)."""
        if self.interrupted:
            return True
        if self.give_up is None:
            return False
        try:
            return bool(self.give_up())
        except Exception:
            return True

    @property
    def remaining(self) -> int:
        return len(self.tokens) - self.done

    def item(self, n: int) -> tuple:
        """The native batch item for this request's next n tokens."""
        a, b = self.done, self.done + n
        if self.logits is None:
            logits = None
        elif self.all_logits:
            logits = self.logits[a:b]
        else:
            logits = self.logits if b == len(self.tokens) else None  # only the last chunk's last row
        hidden = None if self.hidden is None else self.hidden[a:b]
        return (self.seq, self.tokens[a:b], logits, self.all_logits, hidden, self.lora)


@contextmanager
def interrupts_deferred() -> Iterator[list]:
    """Ctrl-C held off while a step runs on the main thread, where Python would raise
    KeyboardInterrupt at any line of the step's bookkeeping (and could leave the
    scheduler busy for good); the list holds the interrupts that came meanwhile.
    Only Python's own handler is replaced, and only on the main thread (the only one
    signal handlers run on): another program's handler is left as it is."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield []
        return
    came: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
