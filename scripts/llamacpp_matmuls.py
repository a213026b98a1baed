"""llama.cpp's own matmuls, input and output, for one prompt: every
quantized weight it multiplies, caught by the graph callback (cb_eval) as
llama.cpp computes it. Needs only llama_cpp and numpy, like
scripts/llamacpp_oracle.py, and runs in a child process the same way.

    python scripts/llamacpp_matmuls.py REQUEST.json OUT_DIR

REQUEST: {"model": path, "ids": [...], "threads": 2}. OUT_DIR/matmuls.npz
holds, for each weight W (by its GGUF name), "W:x" (rows, n_in), the float
activations llama.cpp fed it, and "W:y" (rows, n_out), what it got back; one
batch of all the ids, so llama.cpp takes its batched kernels (repacked Q4_K,
tiled K-quants) as its own prefill does. Tensors that are not a quantized
weight times float activations (norms, attention, the embedding lookup) are
left out.
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np
import llama_cpp as L

F32 = 0


class Tensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h), as far as its name."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


def as_rows(t: Tensor) -> np.ndarray:
    """A float tensor's data as (rows, ne[0]), following its strides (views are not contiguous)."""
    ne, nb = list(t.ne), list(t.nb)
    span = sum((ne[i] - 1) * nb[i] for i in range(4)) + 4
    raw = np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_uint8)), shape=(span,))
    view = np.lib.stride_tricks.as_strided(raw, shape=(ne[3], ne[2], ne[1], ne[0] * 4), strides=(nb[3], nb[2], nb[1], 1))
    return np.ascontiguousarray(view).view(np.float32).reshape(-1, ne[0]).copy()


def capture(found: dict):
    """The cb_eval callback: keeps (x, y) of each quantized weight's product with float rows."""
    def callback(ptr, ask, _user):
        if ask:
            return True
        node = ctypes.cast(ptr, ctypes.POINTER(Tensor)).contents
        if node.type != F32 or not node.src[0] or not node.src[1]:
            return True
        w = ctypes.cast(node.src[0], ctypes.POINTER(Tensor)).contents
        x = ctypes.cast(node.src[1], ctypes.POINTER(Tensor)).contents
        name = w.name.decode()
        if w.type != F32 and x.type == F32 and name.endswith(".weight") and w.ne[0] == x.ne[0]:
            found[f"{name}:x"], found[f"{name}:y"] = as_rows(x), as_rows(node)
        return True
    return L.ggml_backend_sched_eval_callback(callback)


def main(argv: list[str]) -> int:
    req, out = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    ids = req["ids"]
    found: dict[str, np.ndarray] = {}
    callback = capture(found)  # held here: llama.cpp keeps only the pointer
    L.llama_backend_init()
    model = L.llama_model_load_from_file(req["model"].encode(), L.llama_model_default_params())
    params = L.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = max(len(ids), 64)
    params.n_threads = params.n_threads_batch = req.get("threads", 2)
    params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as llama_cpp.Llama (the oracle) runs
    params.cb_eval = callback
    ctx = L.llama_init_from_model(model, params)
    batch = L.llama_batch_init(len(ids), 0, 1)
    batch.n_tokens = len(ids)
    for i, token in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, 1
        batch.seq_id[i][0] = 0
    if L.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    np.savez(out / "matmuls.npz", **found)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
