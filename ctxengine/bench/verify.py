"""``ctx verify``'s checks: the determinism promise, proved on this machine.

For a few prompts, the logits of every position and a greedy continuation are
computed the plain way (N threads, the whole prompt at once) and then every
other way the engine may compute them (verify_ways.py): on one thread, token
by token, in uneven chunks, in one batch with 7 other sequences, after a fork,
after a snapshot and restore, as speculative decoding verifies drafts (the
greedy tokens too, drafted right and wrong), and on every SIMD path this CPU
has. Each must match bit for bit, on every position: the fork and restore
checks compute the rows before the fork or snapshot point too, on the context
that is then forked or snapshotted.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .verify_ways import Replay, Ways, all_logits, greedy

PROMPTS = (
    "The history of the printing press begins in the fifteenth century,",
    "def fib(n):\n    return n if n < 2 else",
    "Les couleurs primaires sont",
)
N_GEN = 8


@dataclass(frozen=True)
class Check:
    label: str
    same_logits: bool          # every row of every prompt bit-identical to the plain way's
    worst: float               # the largest |difference| of a logit otherwise (inf: the shapes differ)
    same_tokens: bool | None   # the greedy tokens too; None where the check generates none of its own

    @property
    def failures(self) -> int:
        return (not self.same_logits) + (self.same_tokens is False)


def bits(a):
    """The float32 values' bit patterns (uint32), to compare exactly."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def run_checks(ways: Ways, n_threads: int) -> Iterator[Check]:
    """Each way of computing ``ways.prompts`` against the plain way, one Check at a time."""
    base, prompts = ways.base, ways.prompts
    refs = {tuple(ids): all_logits(base, ids) for ids in prompts}  # by prompt: two may have one length
    ref_tokens = [greedy(base, ids, ways.n_gen) for ids in prompts]
    for label, fn in ways.checks(n_threads):
        worst, same_logits = 0.0, True
        # The scalar paths are slow on a long prompt, and the sliding window
        # changes no kernel: the SIMD checks use the short prompts.
        for ids in prompts if "SIMD path" not in label else prompts[: ways.n_short]:
            ref, got = refs[tuple(ids)], fn(ids)
            if got.shape != ref.shape or not np.array_equal(bits(got), bits(ref)):
                same_logits = False
                worst = max(worst, float(np.max(np.abs(got - ref))) if got.shape == ref.shape else float("inf"))
        yield Check(label, same_logits, worst, _same_tokens(ways, label, n_threads, ref_tokens))


def _same_tokens(ways: Ways, label: str, n_threads: int, ref_tokens: list[list[int]]) -> bool | None:
    """Greedy tokens are generated where the check has its own model or context."""
    pairs = zip(ways.prompts, ref_tokens)
    if label.startswith(f"{n_threads} threads"):
        return all(greedy(ways.lone, ids, ways.n_gen) == t for ids, t in pairs)
    if label.startswith("snapshot"):
        return all(ways.restored_greedy(ids) == t for ids, t in pairs)
    if label.startswith("speculative"):
        n_vocab = ways.base.config.n_vocab
        return all(greedy(ways.base, ids, ways.n_gen, Replay(len(ids), t, n_vocab)) == t for ids, t in pairs)
    return None
