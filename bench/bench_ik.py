"""ik_llama.cpp's side of bench/bench_core.py: pp512 and tg128 through the
C API of ``ik-llama-cpp-python`` (module ``ik_llama_cpp``).

Self-contained on purpose (no ctxengine, numpy only inside functions), like
ctxengine/bench/llama.py: bench_core.py loads this file by path in a venv
that has ik-llama-cpp-python and nothing of ours. The prompt is the one
llama.py builds, tokenized by ik_llama.cpp itself.

ik_llama.cpp runs at its fastest CPU settings here: the weights repacked at
load into its interleaved-row layouts (``repack_tensors``, llama-bench's
``-rtr 1``), its flash attention, and one 512-token micro-batch.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import time

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined a screw press with movable metal type. Books became cheaper, literacy spread, and "
        "ideas travelled faster than ever before across Europe and then the world. ")


def system_info() -> str:
    """ik_llama.cpp's account of the SIMD features it was built with ('AVX2 = 1 | AVX512 = 0 | ...')."""
    from ik_llama_cpp import _ctypes_api as C

    fn = C._lib.llama_print_system_info
    fn.restype = ctypes.c_char_p
    return fn().decode(errors="replace").strip()


def _load(path, threads: int, n_ctx: int, repack: bool):
    from ik_llama_cpp import _ctypes_api as C

    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.use_mmap = True
    mp.repack_tensors = repack
    model = C.llama_model_load_from_file(os.fsencode(path), mp)
    if not model:
        raise RuntimeError(f"ik_llama.cpp could not load {path}")
    cp = C.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = cp.n_ubatch = 512
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn = True
    ctx = C.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("ik_llama.cpp could not create a context")
    return model, ctx


def measure_ik(path, threads: int, n_prompt: int = 512, n_gen: int = 128, reps: int = 1,
               repack: bool = True, context: int = 16) -> dict:
    import numpy as np
    from ik_llama_cpp import _ctypes_api as C

    model, ctx = _load(path, threads, max(n_prompt, context) + n_gen + 64, repack)
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
    batch = C.llama_batch_init(max(n_prompt, 1), 0, 1)

    def tokenize(text: str) -> list[int]:
        raw = text.encode()
        buf = (C.llama_token * (len(raw) + 8))()
        n = C.llama_tokenize(model, raw, len(raw), buf, len(buf), False, False)
        return list(buf[:n])

    def decode(tokens: list[int], pos0: int) -> None:
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos0 + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
        if C.llama_decode(ctx, batch) != 0:
            raise RuntimeError("ik_llama.cpp: llama_decode failed")

    def argmax_last() -> int:
        ptr = C.llama_get_logits_ith(ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                                   shape=(n_vocab,))))

    try:
        ids: list[int] = []
        while len(ids) < max(n_prompt, context):
            ids += tokenize(TEXT)
        C.llama_kv_cache_clear(ctx)
        decode(ids[:32], 0)  # warm-up
        pp, tg = [], []
        for _ in range(reps):
            C.llama_kv_cache_clear(ctx)
            t0 = time.perf_counter()
            decode(ids[:n_prompt], 0)
            pp.append(n_prompt / (time.perf_counter() - t0))
            C.llama_kv_cache_clear(ctx)
            step = min(512, max(n_prompt, 1))  # the context's n_batch and the batch's size
            for s in range(0, context, step):
                decode(ids[s:min(s + step, context)], s)
            t0 = time.perf_counter()
            for i in range(n_gen):
                decode([argmax_last()], context + i)
            tg.append(n_gen / (time.perf_counter() - t0))
        return {"prefill_tps": statistics.median(pp), "decode_tps": statistics.median(tg),
                "system_info": system_info() + (" | run-time repack" if repack else "")}
    finally:
        C.llama_batch_free(batch)
        C.llama_free(ctx)
        C.llama_free_model(model)
