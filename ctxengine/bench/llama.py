"""llama.cpp's side of ``ctx bench``: the same measurements through llama-cpp-python.

Self-contained on purpose (no relative imports, nothing of ours, numpy only
inside functions): ``ctx bench --llama-python PY`` and bench/bench_core.py
load this file by path in a separate venv that has llama-cpp-python but
not ctxengine.
"""
from __future__ import annotations

import statistics
import time

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined a screw press with movable metal type. Books became cheaper, literacy spread, and "
        "ideas travelled faster than ever before across Europe and then the world. ")


def prompt_ids(tokenize, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenize(TEXT)
    return ids[:n]


def measure_llama(path, threads: int, n_prompt: int = 512, n_gen: int = 128, reps: int = 3,
                  batches=(1, 4, 8), batch_prompt: int = 128, context: int = 16) -> dict:
    import ctypes

    import llama_cpp
    import numpy as np

    m = llama_cpp.Llama(str(path), n_threads=threads, n_threads_batch=threads, n_batch=512, n_ubatch=512,
                        n_ctx=max(n_prompt, context) + n_gen + 64, verbose=False)
    ids = prompt_ids(lambda t: m.tokenize(t.encode(), add_bos=False), max(n_prompt, context))
    n_vocab = m.n_vocab()

    def last_logits():
        ptr = llama_cpp.llama_get_logits_ith(m._ctx.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))

    m.reset()
    m.eval(ids[:32])
    pp, tg, ttft = [], [], []
    for _ in range(reps):
        m.reset()
        t0 = time.perf_counter()
        m.eval(ids[:n_prompt])
        pp.append(n_prompt / (time.perf_counter() - t0))
        m.reset()
        m.eval(ids[:context])  # in chunks of n_batch
        t0 = time.perf_counter()
        for _ in range(n_gen):
            m.eval([int(np.argmax(last_logits()))])
        tg.append(n_gen / (time.perf_counter() - t0))
        m.reset()
        t0 = time.perf_counter()
        m.eval(ids[:batch_prompt])
        int(np.argmax(last_logits()))
        ttft.append((time.perf_counter() - t0) * 1e3)
    batched = {str(b): measure_llama_batched(m, threads, b, batch_prompt) for b in batches}
    return {"prefill_tps": statistics.median(pp), "decode_tps": statistics.median(tg),
            "batched_decode_tps": batched, "ttft_ms": statistics.median(ttft), "system_info": system_info()}


def system_info() -> str:
    """llama.cpp's own account of the SIMD features it was built with and runs ('AVX2 = 1 | ...')."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode(errors="replace").strip()


class BatchedContext:
    """A llama.cpp context for several sequences, fed through one reusable llama_batch."""

    def __init__(self, m, threads: int, n_ctx: int, n_seq: int, n_batch: int, unified: bool | None = None):
        import llama_cpp

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = -(-n_ctx // 256) * 256
        params.n_batch = params.n_ubatch = max(512, n_seq)
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = threads
        if unified is not None:
            params.kv_unified = unified
        self.ctx = llama_cpp.llama_init_from_model(m._model.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a batched context")
        self.n_vocab = m.n_vocab()
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)

    def decode(self, rows) -> None:
        """rows: (token, pos, seq, want_logits), one llama_decode."""
        import llama_cpp

        batch = self.batch
        batch.n_tokens = len(rows)
        for i, (tok, pos, seq, want) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, want
        if llama_cpp.llama_decode(self.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(self, i: int) -> int:
        """Greedy token of the batch's row i."""
        import ctypes

        import llama_cpp
        import numpy as np

        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                                   shape=(self.n_vocab,))))

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


def measure_llama_batched(m, threads: int, n_seq: int, n_prompt: int = 128, n_gen: int = 64) -> float:
    """llama.cpp's aggregate decode of n_seq sequences, as llama-batched-bench
    runs it: every prompt prefilled, then one llama_decode per step holding
    the next token of every sequence (greedy, like measure_batched)."""
    per_seq = -(-(n_prompt + n_gen + 16) // 256) * 256  # llama.cpp splits n_ctx evenly between sequences
    bc = BatchedContext(m, threads, n_seq * per_seq, n_seq, max(n_prompt, n_seq))
    try:
        ids = prompt_ids(lambda t: m.tokenize(t.encode(), add_bos=False), n_prompt + n_seq)
        last = []
        for s in range(n_seq):
            bc.decode([(ids[s + j], j, s, j == n_prompt - 1) for j in range(n_prompt)])
            last.append(bc.argmax(n_prompt - 1))
        t0 = time.perf_counter()
        for step in range(n_gen):
            bc.decode([(last[s], n_prompt + step, s, True) for s in range(n_seq)])
            last = [bc.argmax(s) for s in range(n_seq)]
        return n_seq * n_gen / (time.perf_counter() - t0)
    finally:
        bc.close()


def measure_llama_branches(path, threads: int, n_branch: int, n_prefix: int, n_gen: int) -> dict:
    """llama.cpp's aggregate decode of n_branch sequences continuing one n_prefix-token
    prefix (first tokens as ctxengine/bench/batched.py's Branches): "shared", the
    prefix prefilled once and copied to every sequence with llama_memory_seq_cp
    (one KV cache for all, kv_unified), and "unrelated", each sequence prefilling
    it into its own part of the cache."""
    import llama_cpp

    m = llama_cpp.Llama(str(path), n_threads=threads, n_threads_batch=threads, n_ctx=256, verbose=False)
    prefix = prompt_ids(lambda t: m.tokenize(t.encode(), add_bos=False), n_prefix)
    first = prompt_ids(lambda t: m.tokenize(t.encode(), add_bos=False), n_branch)
    per_seq = -(-(n_prefix + n_gen + 16) // 256) * 256
    out = {}
    for kind in ("shared", "unrelated"):
        shared = kind == "shared"
        n_ctx = per_seq + n_branch * (n_gen + 16) if shared else n_branch * per_seq
        bc = BatchedContext(m, threads, n_ctx, n_branch, 512, unified=shared)
        try:
            for s in range(1 if shared else n_branch):
                for c in range(0, n_prefix, 512):
                    bc.decode([(prefix[j], j, s, False) for j in range(c, min(n_prefix, c + 512))])
            if shared:
                mem = llama_cpp.llama_get_memory(bc.ctx)
                for s in range(1, n_branch):
                    llama_cpp.llama_memory_seq_cp(mem, 0, s, -1, -1)
            last = list(first)
            t0 = time.perf_counter()
            for step in range(n_gen):
                bc.decode([(last[s], n_prefix + step, s, True) for s in range(n_branch)])
                last = [bc.argmax(s) for s in range(n_branch)]
            out[kind] = n_branch * n_gen / (time.perf_counter() - t0)
        finally:
            bc.close()
    return out
