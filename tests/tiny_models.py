"""Tiny synthetic GGUF models (random weights) and a numpy reference forward
pass, for checking every architecture and weight type the engine claims."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class TinyConfig:
    arch: str = "llama"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 96
    n_ctx: int = 256
    rope_base: float = 10000.0
    eps: float = 1e-5
    wtype: str = "F32"          # F32, F16, BF16, Q8_0, Q4_0, Q4_1
    tied: bool = True


def byte_vocab() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: one token per byte, one merge, two controls."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)] + ["ab", "<s>", "</s>"]


def make_weights(cfg: TinyConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_vocab = len(byte_vocab())
    qd, kd = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": mat(n_vocab, cfg.n_embd), "output_norm.weight": norm(cfg.n_embd)}
    if not cfg.tied:
        w["output.weight"] = mat(n_vocab, cfg.n_embd)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(cfg.n_embd)
        w[p + "attn_q.weight"] = mat(qd, cfg.n_embd)
        w[p + "attn_k.weight"] = mat(kd, cfg.n_embd)
        w[p + "attn_v.weight"] = mat(kd, cfg.n_embd)
        w[p + "attn_output.weight"] = mat(cfg.n_embd, qd)
        if cfg.arch == "qwen2":
            for name, n in (("attn_q.bias", qd), ("attn_k.bias", kd), ("attn_v.bias", kd)):
                w[p + name] = (0.1 * rng.standard_normal(n)).astype(np.float32)
        if cfg.arch == "qwen3":
            w[p + "attn_q_norm.weight"] = norm(cfg.head_dim)
            w[p + "attn_k_norm.weight"] = norm(cfg.head_dim)
        w[p + "ffn_norm.weight"] = norm(cfg.n_embd)
        w[p + "ffn_gate.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_up.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_down.weight"] = mat(cfg.n_embd, cfg.n_ff)
    return w


def write_gguf(path: Path, cfg: TinyConfig, weights: dict[str, np.ndarray],
               raw: dict[str, gguf.GGMLQuantizationType] | None = None) -> dict[str, np.ndarray]:
    """Write the model; returns the weights as the file holds them (after rounding).

    `raw` stores the named tensors as zero bytes of another type (to test types
    the engine refuses)."""
    w = gguf.GGUFWriter(str(path), cfg.arch)
    w.add_name(f"tiny-{cfg.arch}")
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.eps)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_rope_dimension_count(cfg.head_dim)
    vocab = byte_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([1] * 257 + [3, 3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(258)
    w.add_add_bos_token(False)
    stored = {}
    qtype = gguf.GGMLQuantizationType[cfg.wtype]
    for name, arr in weights.items():
        if raw and name in raw:
            block, size = gguf.GGML_QUANT_SIZES[raw[name]]
            data = np.zeros((arr.shape[0], arr.shape[1] // block * size), np.uint8)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw[name])
        elif arr.ndim == 2 and cfg.wtype != "F32":
            if cfg.wtype == "F16":
                data = arr.astype(np.float16)
                w.add_tensor(name, data)
                stored[name] = data.astype(np.float32)
            else:
                data = gguf.quants.quantize(arr, qtype)
                w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
                stored[name] = gguf.quants.dequantize(data, qtype).reshape(arr.shape).astype(np.float32)
        else:
            w.add_tensor(name, arr)
            stored[name] = arr
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def kv8_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (..., n) as a q8 KV page holds it (quant.h quantize_row_kv8, in float32 like
    the engine): int8 values (..., n) and one f16 scale per 32 along the last axis (..., n / 32)."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv).astype(np.int8)  # round half to even
    d = (amax / np.float32(127)).astype(np.float16)
    return q.reshape(x.shape), d[..., 0]


def kv8_round(x: np.ndarray) -> np.ndarray:
    """x after a trip through a q8 KV page, as float64."""
    q, d = kv8_quantize(x)
    return (q.reshape(*x.shape[:-1], -1, 32) * d[..., None].astype(np.float64)).reshape(x.shape)


def reference_logits(cfg: TinyConfig, w: dict[str, np.ndarray], tokens: list[int], kv: str = "f16") -> np.ndarray:
    """Plain float64 transformer; K and V rounded as the engine stores them in a
    page of KV dtype `kv` (f16; q8: both 8-bit; vq8: K f16, V 8-bit)."""
    f = lambda a: a.astype(np.float64)  # noqa: E731
    hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_head_kv

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.eps) * g

    inv = cfg.rope_base ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(len(tokens))[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):  # v: (T, heads, hd)
        out = v.copy()
        if cfg.arch in ("qwen2", "qwen3"):
            a, b = v[..., : hd // 2], v[..., hd // 2:]
            out[..., : hd // 2] = a * cos[:, None] - b * sin[:, None]
            out[..., hd // 2:] = a * sin[:, None] + b * cos[:, None]
        else:
            a, b = v[..., 0::2], v[..., 1::2]
            out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
            out[..., 1::2] = a * sin[:, None] + b * cos[:, None]
        return out

    T = len(tokens)
    x = f(w["token_embd.weight"])[tokens]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = rms(x, f(w[p + "attn_norm.weight"]))
        q = h @ f(w[p + "attn_q.weight"]).T
        k = h @ f(w[p + "attn_k.weight"]).T
        v = h @ f(w[p + "attn_v.weight"]).T
        if cfg.arch == "qwen2":
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if cfg.arch == "qwen3":
            q, k = rms(q, f(w[p + "attn_q_norm.weight"])), rms(k, f(w[p + "attn_k_norm.weight"]))
        q, k = rope(q), rope(k)
        k = kv8_round(k) if kv == "q8" else f(k.astype(np.float16))
        v = kv8_round(v) if kv in ("q8", "vq8") else f(v.astype(np.float16))
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g]
        x = x + att.reshape(T, nh * hd) @ f(w[p + "attn_output.weight"]).T
        h = rms(x, f(w[p + "ffn_norm.weight"]))
        gt = h @ f(w[p + "ffn_gate.weight"]).T
        up = h @ f(w[p + "ffn_up.weight"]).T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ f(w[p + "ffn_down.weight"]).T
    out = w.get("output.weight", w["token_embd.weight"])
    return rms(x, f(w["output_norm.weight"])) @ f(out).T
