"""``ctx verify [-m MODEL] [--kv DTYPE]``: prove the determinism promise on this machine.

Every way the engine may compute a prompt's logits (threads, token by token,
chunks, batches, forks, restores, speculative verification, every SIMD path
this CPU has) against the plain way, bit for bit: ctxengine/bench/verify.py
runs the checks, this prints their table. Exit status 1 on any mismatch.
"""
from __future__ import annotations

import argparse

from .common import add_model_arguments, load_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)


def main(args: argparse.Namespace) -> int:
    # Imported here, not at module level: every `ctx` command builds the parser from this module.
    from ..bench.verify import N_GEN, PROMPTS, run_checks
    from ..bench.verify_ways import Ways
    from ..engine.cpu import physical_cores
    from ..errors import CtxError

    n_threads = args.threads or max(2, physical_cores())
    base = load_model(args, threads=n_threads)
    lone = load_model(args, threads=1)
    ways = Ways(base, lone, PROMPTS, N_GEN)
    prompts, window = ways.prompts, ways.window
    print(f"{base.name}  weight_id {base.weight_id[:16]}  {base.engine.kv_dtype} KV  "
          f"({len(prompts)} prompts, {sum(map(len, prompts))} positions"
          + (f"; sliding window {window}, the last prompt past it" if window else "") + ")")
    print(f"{'check':<30} {'logits':<22} {'greedy tokens':<14}")
    failed = 0
    for check in run_checks(ways, n_threads):
        logits_cell = "bit-identical" if check.same_logits else f"MISMATCH (max {check.worst:.3g})"
        tokens_cell = "-" if check.same_tokens is None else "identical" if check.same_tokens else "MISMATCH"
        print(f"{check.label:<30} {logits_cell:<22} {tokens_cell:<14}")
        failed += check.failures
    if failed:
        raise CtxError(f"{failed} determinism check(s) failed on this machine")
    print("all identical")
    return 0
