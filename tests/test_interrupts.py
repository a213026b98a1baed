"""Ctrl-C in the middle of a prefill or a generation (KeyboardInterrupt on the main
thread, as a terminal or a notebook sends it) leaves the context as if the interrupted
step had never run: its KV holds exactly its tokens, and what it generates next is what
a fresh context holding the same tokens generates, bit for bit.

Each case runs in a child process that interrupts itself with SIGINT while the main
thread is inside the step (alone, so the step runs on the main thread itself, or beside
a second stream on another thread, so the main thread waits on the scheduler's)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import _thread, json, os, signal, sys, threading, time
    import ctxengine as ce

    what, company, speculative = sys.argv[1], sys.argv[2] == "busy", sys.argv[3] == "spec"
    # Python's own Ctrl-C handler, as a terminal's Python has it: a suite started in the
    # background (`cmd &` without job control) passes SIGINT on ignored, and then neither
    # a signal nor interrupt_main() would reach the step (every case failed so).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A real SIGINT wakes a blocked wait; interrupt_main() only marks one pending, which a
    # wait that is not woken raises the moment it returns (the request then finished).
    interrupt = (lambda: os.kill(os.getpid(), signal.SIGINT)) if sys.argv[4] == "signal" else _thread.interrupt_main
    model = ce.load("smollm2", threads=2)
    text = "The tide comes in over the rocks and the pools fill again. " * 60
    stop = threading.Event()
    if company:  # another stream decoding all the while: the main thread's steps go through the loop
        other = model.context()
        other.append("Count to a thousand:")
        def run():
            while not stop.is_set():
                for _ in other.generate(8, temperature=0.0, speculative=False):
                    pass
                other.rewind(8)
        threading.Thread(target=run, daemon=True).start()
    ctx = model.context()
    if what == "generate":
        ctx.append(text[:400])
    hits = []
    for delay in (0.05, 0.15, 0.3, 0.6):
        timer = threading.Timer(delay, interrupt)
        timer.start()
        try:
            if what == "append":
                ctx.append(text)
            else:
                for _ in ctx.generate(400, temperature=0.0, speculative=None if speculative else False):
                    pass
            timer.join()
            time.sleep(0.05)  # the signal came after the step: not a case
        except KeyboardInterrupt:
            hits.append(delay)
        timer.cancel()
    stop.set()
    n_tokens, n_cached = ctx.n_tokens, ctx.n_cached
    if what == "append":
        ctx.append(" And then")
    fresh = model.context()
    fresh.append(ctx.tokens)
    go = dict(temperature=0.0, speculative=False)
    after = [p.token_id for p in ctx.generate(24, **go)]
    want = [p.token_id for p in fresh.generate(24, **go)]
    print(json.dumps({"hits": hits, "n_tokens": n_tokens, "n_cached": n_cached, "after": after, "want": want}))
""")


@pytest.mark.parametrize("what,company,spec,how", [
    ("append", "alone", "-", "signal"), ("append", "busy", "-", "signal"), ("append", "alone", "-", "pending"),
    ("generate", "alone", "plain", "signal"), ("generate", "alone", "spec", "signal"),
    ("generate", "busy", "plain", "signal"), ("generate", "busy", "spec", "signal"),
    ("generate", "alone", "spec", "pending")])
def test_an_interrupted_step_leaves_the_context_as_it_was(what, company, spec, how):
    # Before: an interrupted append kept the KV the step went on to write (n_cached 1601
    # for 0 tokens), and the next prompt of the same length reused it; an interrupted
    # generate left its last token's KV or its drafts behind, one token out of step.
    done = subprocess.run([sys.executable, "-c", CHILD, what, company, spec, how], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["hits"], "no interrupt landed inside a step"
    assert got["n_cached"] <= got["n_tokens"], got
    assert got["after"] == got["want"], got
