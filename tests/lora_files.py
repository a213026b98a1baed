"""LoRA adapter files as llama.cpp's convert_lora_to_gguf.py writes them,
with random low-rank A and B, for the adapter tests."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
FFN = ("ffn_gate", "ffn_up", "ffn_down")
ALL = ATTN + FFN


def target_shapes(meta: dict, arch: str) -> dict[str, tuple[int, int]]:
    """(n_in, n_out) of each target matrix, from a model's metadata."""
    e = meta[f"{arch}.embedding_length"]
    nh, nkv = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    hd = meta.get(f"{arch}.attention.key_length", e // nh)
    f = meta[f"{arch}.feed_forward_length"]
    return {"attn_q": (e, nh * hd), "attn_k": (e, nkv * hd), "attn_v": (e, nkv * hd), "attn_output": (nh * hd, e),
            "ffn_gate": (e, f), "ffn_up": (e, f), "ffn_down": (f, e)}


def random_lora(shapes: dict[str, tuple[int, int]], n_layer: int, rank: int, targets=ALL, *, seed: int = 0,
                size: float = 0.02) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"blk.N.target": (A (rank, n_in), B (n_out, rank))} for every layer and target."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(n_layer):
        for t in targets:
            n_in, n_out = shapes[t]
            a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            b = (size * rng.standard_normal((n_out, rank))).astype(np.float32)
            out[f"blk.{layer}.{t}"] = (a, b)
    return out


def write_lora(path: Path, arch: str, mats: dict[str, tuple[np.ndarray, np.ndarray]], *, alpha: float = 0.0,
               dtype: str | tuple[str, str] = "F32",
               extra: dict | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """An adapter GGUF: general.type adapter, adapter.type lora, lora_a / lora_b per
    matrix, in F32, F16, BF16 or Q8_0 (or a (lora_a, lora_b) pair of those); returns
    the matrices as the file holds them."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    if isinstance(alpha, np.float64):  # as a float64 key, for values float32 cannot hold
        w.add_float64("adapter.lora.alpha", float(alpha))
    else:
        w.add_float32("adapter.lora.alpha", float(alpha))
    for key, value in (extra or {}).items():
        w.add_string(key, value)
    dtypes = (dtype, dtype) if isinstance(dtype, str) else dtype
    stored = {}
    for name, pair in mats.items():
        kept = []
        for suffix, m, dtype in zip(("lora_a", "lora_b"), pair, dtypes):
            qtype = gguf.GGMLQuantizationType[dtype]
            if dtype == "F32":
                w.add_tensor(f"{name}.weight.{suffix}", m)
                kept.append(m)
            elif dtype == "F16":
                w.add_tensor(f"{name}.weight.{suffix}", m.astype(np.float16))
                kept.append(m.astype(np.float16).astype(np.float32))
            else:
                data = gguf.quants.quantize(m, qtype)
                w.add_tensor(f"{name}.weight.{suffix}", data, raw_shape=data.shape, raw_dtype=qtype)
                kept.append(gguf.quants.dequantize(data, qtype).reshape(m.shape).astype(np.float32))
        stored[name] = tuple(kept)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def merged(weights: dict[str, np.ndarray], mats: dict, factor: float) -> dict[str, np.ndarray]:
    """Base weights with factor * B A added (float64), for the reference forward."""
    out = dict(weights)
    for name, (a, b) in mats.items():
        key = name + ".weight"
        out[key] = weights[key].astype(np.float64) + factor * (b.astype(np.float64) @ a.astype(np.float64))
    return out


# The adapter of the llama.cpp comparison (scripts/lora_reference.py, tests/test_lora_llama.py):
# rank 16 on every attention and FFN matrix of SmolLM2, alpha 32 (factor 2 at scale 1).
SMOLLM2_LORA = dict(rank=16, alpha=32.0, seed=22, size=0.02)


def smollm2_lora(path: Path, meta: dict, *, rank: int | None = None, strength: float = 1.0,
                 seed: int | None = None, dtype: str | tuple[str, str] = "F32") -> Path:
    """The comparison's adapter (or, with other arguments, another like it)."""
    spec = dict(SMOLLM2_LORA, **({"rank": rank} if rank else {}), **({"seed": seed} if seed else {}))
    mats = random_lora(target_shapes(meta, "llama"), meta["llama.block_count"], spec["rank"], ALL,
                       seed=spec["seed"], size=spec["size"] * strength)
    write_lora(path, "llama", mats, alpha=spec["alpha"], dtype=dtype)
    return path
