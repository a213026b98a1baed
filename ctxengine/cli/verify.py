"""``ctx verify [-m MODEL] [--kv DTYPE]``: prove the determinism promise on this machine.

For a few prompts, the logits of every position and a greedy continuation are
computed the plain way (one thread, the whole prompt at once) and then every
other way the engine may compute them: with N threads, token by token, in
uneven chunks, in one batch with 7 other sequences, after a fork, after a
snapshot and restore, as speculative decoding verifies drafts (the greedy
tokens too, drafted right and wrong), and on every SIMD path this CPU has. Each must match
bit for bit, on every position: the fork and restore checks compute the rows
before the fork or snapshot point too, on the context that is then forked or
snapshotted. Exit status 1 on any mismatch.
"""
from __future__ import annotations

import argparse

from .common import add_model_arguments, load_model

PROMPTS = (
    "The history of the printing press begins in the fifteenth century,",
    "def fib(n):\n    return n if n < 2 else",
    "Les couleurs primaires sont",
)
N_GEN = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)


def bits(a):
    """The float32 values' bit patterns (uint32), to compare exactly."""
    import numpy as np

    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def main(args: argparse.Namespace) -> int:
    import numpy as np  # here, not at import: every `ctx` command builds the parser from this module

    from ..engine.cpu import physical_cores
    from ..errors import CtxError
    from .verify_ways import Replay, Ways, all_logits, greedy

    n_threads = args.threads or max(2, physical_cores())
    base = load_model(args, threads=1)
    wide = load_model(args, threads=n_threads)
    ways = Ways(base, wide, PROMPTS, N_GEN)
    prompts, window = ways.prompts, ways.window
    refs = {tuple(ids): all_logits(base, ids) for ids in prompts}  # by prompt: two may have one length
    ref_tokens = [greedy(base, ids, N_GEN) for ids in prompts]

    print(f"{base.name}  weight_id {base.weight_id[:16]}  {base.engine.kv_dtype} KV  "
          f"({len(prompts)} prompts, {sum(map(len, prompts))} positions"
          + (f"; sliding window {window}, the last prompt past it" if window else "") + ")")
    print(f"{'check':<30} {'logits':<22} {'greedy tokens':<14}")
    failed = 0
    for label, fn in ways.checks(n_threads):
        worst, same_logits = 0.0, True
        # The scalar paths are slow on a long prompt, and the sliding window
        # changes no kernel: the SIMD checks use the short prompts.
        for ids in prompts if "SIMD path" not in label else prompts[: ways.n_short]:
            ref, got = refs[tuple(ids)], fn(ids)
            if got.shape != ref.shape or not np.array_equal(bits(got), bits(ref)):
                same_logits = False
                worst = max(worst, float(np.max(np.abs(got - ref))) if got.shape == ref.shape else float("inf"))
        same_tokens = None  # greedy tokens are generated where the check has its own model or context
        if label.startswith(f"{n_threads} threads"):
            same_tokens = all(greedy(wide, ids, N_GEN) == t for ids, t in zip(prompts, ref_tokens))
        elif label.startswith("snapshot"):
            same_tokens = all(ways.restored_greedy(ids) == t for ids, t in zip(prompts, ref_tokens))
        elif label.startswith("speculative"):
            same_tokens = all(greedy(base, ids, N_GEN, Replay(len(ids), t, base.config.n_vocab)) == t
                              for ids, t in zip(prompts, ref_tokens))
        logits_cell = "bit-identical" if same_logits else f"MISMATCH (max {worst:.3g})"
        tokens_cell = "-" if same_tokens is None else "identical" if same_tokens else "MISMATCH"
        print(f"{label:<30} {logits_cell:<22} {tokens_cell:<14}")
        failed += (not same_logits) + (same_tokens is False)
    if failed:
        raise CtxError(f"{failed} determinism check(s) failed on this machine")
    print("all identical")
    return 0
