"""Batched decode as bench/bench_batched.py measures it: streams and branches.

Streams: B sequences, each with its own prompt, decode one token per step
together (one native forward a step for all B), like llama-batched-bench's
aggregate decode. Branches: B sequences that continue one long prefix, either
forked from it (their page tables share the prefix's physical pages) or as
unrelated contexts (each holds its own copy of the same KV bytes), so the two
do the same arithmetic on the same bits and differ only in what they share.

The prompts are prefilled once; every timed round decodes from fresh forks of
them (O(pages), no KV bytes copied), so rounds of different kinds can
alternate and see the same machine load.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from .llama import prompt_ids


class Decoded(NamedTuple):
    wall: float                # aggregate tokens per second
    cpu: float                 # aggregate tokens per second of the process's CPU time
    tokens: list[list[int]]    # each sequence's greedy tokens


class Streams:
    """Up to n_max prefilled prompts (prompt s is the text's tokens [s, s + n_prompt))."""

    def __init__(self, eng, n_max: int, n_prompt: int):
        self.eng = eng
        ids = prompt_ids(eng.tokenize, n_prompt + n_max)
        self.bases = [eng.new_sequence() for _ in range(n_max)]
        self.first = [int(np.argmax(eng.forward(s, ids[k:k + n_prompt]))) for k, s in enumerate(self.bases)]

    def decode(self, n_seq: int, n_gen: int) -> Decoded:
        """The first n_seq streams decoding n_gen tokens together."""
        seqs = [b.fork() for b in self.bases[:n_seq]]
        return decode_together(self.eng, seqs, self.first[:n_seq], n_gen)


class Branches:
    """n_branch continuations of one n_prefix-token prefix, each starting from its own token."""

    def __init__(self, eng, n_branch: int, n_prefix: int):
        self.eng = eng
        self.prefix = eng.new_sequence()
        eng.forward(self.prefix, prompt_ids(eng.tokenize, n_prefix))
        # Each its own first token (the text's first ones), so the branches diverge at once, as sampled replies would.
        self.first = prompt_ids(eng.tokenize, n_branch)

    def decode(self, shared: bool, n_gen: int) -> Decoded:
        """The branches as forks of the prefix (shared) or as unrelated copies, decoding together."""
        seqs = [self.prefix.fork() if shared else copy_sequence(self.eng, self.prefix) for _ in self.first]
        return decode_together(self.eng, seqs, self.first, n_gen)


def decode_together(eng, seqs, first: list[int], n_gen: int) -> Decoded:
    """Feed each sequence its first token, then n_gen - 1 greedy ones, all sequences in one forward a step.
    The CPU-time rate counts the thread pool's waiting too, so it is the steadier one under load
    only at one thread; at more it shows what the cores spent, waiting included."""
    last = list(first)
    out = [[t] for t in first]
    bufs = [np.empty((1, eng.config.n_vocab), np.float32) for _ in seqs]
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n_gen):
        eng._core.forward([(s, np.array([t], np.int32), buf, False, None) for s, t, buf in zip(seqs, last, bufs)])
        last = [int(np.argmax(buf[0])) for buf in bufs]
        for o, t in zip(out, last):
            o.append(t)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(seqs) * n_gen
    seqs.clear()  # the callers' lists hold the only references: the pages go back now
    return Decoded(n / wall, n / cpu, out)


def copy_sequence(eng, seq):
    """A new page table holding copies of seq's pages (same bytes, none shared)."""
    out = eng.new_sequence()
    pt, n = eng.pool.page_tokens, seq.n_tokens
    released = seq.n_released
    for i in range(len(seq.pages)):
        pool = eng.trim_pool if i < released else eng.pool
        page = pool.import_page(seq.export_page(i))
        out.append_page(page, min(pt, n - i * pt), i < released)
        pool.release(page)  # the page table holds its own reference
    return out
