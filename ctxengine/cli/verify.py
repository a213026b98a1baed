"""``ctx verify [-m MODEL] [--kv DTYPE]``: prove the determinism promise on this machine.

For a few prompts, the logits of every position and a greedy continuation are
computed the plain way (one thread, the whole prompt at once) and then every
other way the engine may compute them: with N threads, token by token, in
uneven chunks, in one batch with 7 other sequences, after a fork, after a
snapshot and restore, and on every SIMD path this CPU has. Each must match
bit for bit, on every position: the fork and restore checks compute the rows
before the fork or snapshot point too, on the context that is then forked or
snapshotted. Exit status 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import tempfile
from typing import Callable


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


def greedy(model, ids: list[int], n: int) -> list[int]:
    ctx = model.context(None)
    ctx.append(ids)
    out = [p.token_id for p in ctx.generate(n, temperature=0.0) if p.token_id is not None]
    ctx.delete()
    return out


def main(args: argparse.Namespace) -> int:
    import numpy as np  # here, not at import: every `ctx` command builds the parser from this module

    from .. import _core
    from ..engine.cpu import physical_cores
    from ..errors import CtxError
    from ..store import Store

    n_threads = args.threads or max(2, physical_cores())
    base = load_model(args, threads=1)
    wide = load_model(args, threads=n_threads)
    eng = base.engine
    prompts = [eng.tokenize(p, add_bos=eng.tokenizer.add_bos) for p in PROMPTS]
    window = eng.config.swa_window
    if window:  # a prompt long enough that the sliding window releases pages before every split point
        long = eng.tokenize(" ".join(PROMPTS) * 8, add_bos=eng.tokenizer.add_bos)
        while len(long) < window + 4 * eng.pool.page_tokens:
            long += long[1:]
        prompts.append(long[: window + 4 * eng.pool.page_tokens + 5])

    def split(ids):
        # Past the window for the long prompt (released pages are forked and stored), else half way.
        return len(ids) - 20 if window and len(ids) > window else len(ids) // 2

    def all_logits(m, ids):
        return m.engine.forward(m.engine.new_sequence(), ids, all_logits=True)

    refs = {tuple(ids): all_logits(base, ids) for ids in prompts}  # by prompt: two may have one length
    ref_tokens = [greedy(base, ids, N_GEN) for ids in prompts]

    def token_by_token(ids):
        seq = eng.new_sequence()
        return np.stack([eng.forward(seq, [t]) for t in ids])

    def chunked(ids):
        seq, rows, start, sizes = eng.new_sequence(), [], 0, (3, 1, 5, 2, 7)
        while start < len(ids):
            size = sizes[len(rows) % len(sizes)]
            rows.append(eng.forward(seq, ids[start:start + size], all_logits=True))
            start += size
        return np.concatenate(rows)

    def batched(ids):
        # The prompt shares one forward step with 7 other sequences of other lengths.
        others = [prompts[(k + 1) % len(prompts)][: 3 + 2 * k] for k in range(7)]
        items, out = [], None
        for k, toks in enumerate([ids] + others):
            buf = np.empty((len(toks), eng.config.n_vocab), np.float32)
            items.append((eng.new_sequence(), np.asarray(toks, np.int32), buf, True, None))
            if k == 0:
                out = buf
        eng._core.forward(items)
        return out

    def prefilled(ids):
        """A context holding ids whose every row of logits was kept: (context, rows)."""
        seq = eng.new_sequence()
        rows = eng.forward(seq, ids, all_logits=True)
        return base.contexts.adopt(None, seq, ids), rows

    def forked(ids):
        # Every row is computed here: the trunk's from its own prefill, the rest on
        # the branch after the trunk wrote other tokens into their shared last page.
        half = split(ids)
        trunk, before = prefilled(ids[:half])
        branch = trunk.fork()
        trunk.append(ids[half:][::-1])
        after = eng.forward(branch._seq, ids[half:], all_logits=True)
        trunk.delete()
        branch.delete()
        return np.concatenate([before, after])

    def restored(ids):
        half = split(ids)
        with tempfile.TemporaryDirectory() as d, Store(d) as store:
            ctx, before = prefilled(ids[:half])
            ctx.snapshot(store, ref="verify")
            ctx.delete()
            back = base.restore(store, "verify")
            after = eng.forward(back._seq, ids[half:], all_logits=True)
            back.delete()
        return np.concatenate([before, after])

    def restored_greedy(ids):
        with tempfile.TemporaryDirectory() as d, Store(d) as store:
            ctx = base.context(None)
            ctx.append(ids)
            ctx.snapshot(store, ref="verify")
            ctx.delete()
            back = base.restore(store, "verify")
            out = [p.token_id for p in back.generate(N_GEN, temperature=0.0) if p.token_id is not None]
            back.delete()
        return out

    checks: list[tuple[str, Callable]] = [
        (f"{n_threads} threads vs 1", lambda ids: all_logits(wide, ids)),
        ("token by token vs at once", token_by_token),
        ("uneven chunks vs at once", chunked),
        ("in a batch of 8 vs alone", batched),
        ("forked vs fresh", forked),
        ("snapshot-restored vs fresh", restored),
    ]
    prior = _core.active_isa()
    for isa in ("scalar", "avx2", "avx512"):
        if isa != prior and ["scalar", "avx2", "avx512"].index(isa) <= ["scalar", "avx2", "avx512"].index(_core.detect_isa()):
            def on_isa(ids, isa=isa):
                _core.set_isa(isa)
                try:
                    return all_logits(base, ids)
                finally:
                    _core.set_isa(prior)
            checks.append((f"{isa} vs {prior} SIMD path", on_isa))

    print(f"{base.name}  weight_id {base.weight_id[:16]}  {eng.kv_dtype} KV  "
          f"({len(prompts)} prompts, {sum(map(len, prompts))} positions"
          + (f"; sliding window {window}, the last prompt past it" if window else "") + ")")
    print(f"{'check':<30} {'logits':<22} {'greedy tokens':<14}")
    failed = 0
    for label, fn in checks:
        worst, same_logits = 0.0, True
        # The scalar paths are slow on a long prompt, and the sliding window
        # changes no kernel: the SIMD checks use the short prompts.
        for ids in prompts if "SIMD path" not in label else prompts[: len(PROMPTS)]:
            ref, got = refs[tuple(ids)], fn(ids)
            if got.shape != ref.shape or not np.array_equal(bits(got), bits(ref)):
                same_logits = False
                worst = max(worst, float(np.max(np.abs(got - ref))) if got.shape == ref.shape else float("inf"))
        same_tokens = None  # greedy tokens are generated where the check has its own model or context
        if label.startswith(f"{n_threads} threads"):
            same_tokens = all(greedy(wide, ids, N_GEN) == t for ids, t in zip(prompts, ref_tokens))
        elif label.startswith("snapshot"):
            same_tokens = all(restored_greedy(ids) == t for ids, t in zip(prompts, ref_tokens))
        logits_cell = "bit-identical" if same_logits else f"MISMATCH (max {worst:.3g})"
        tokens_cell = "-" if same_tokens is None else "identical" if same_tokens else "MISMATCH"
        print(f"{label:<30} {logits_cell:<22} {tokens_cell:<14}")
        failed += (not same_logits) + (same_tokens is False)
    if failed:
        raise CtxError(f"{failed} determinism check(s) failed on this machine")
    print("all identical")
    return 0
