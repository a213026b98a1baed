"""Tiny synthetic GGUF models (random weights) and a numpy reference forward
pass, for checking every architecture and weight type the engine claims."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

import kquant_numpy


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
    wtype: str = "F32"          # F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, a K-quant, or "mixed"
    tied: bool = True
    swa_window: int = 0         # gemma3: sliding window of the local layers
    swa_pattern: int = 3        # gemma3: every swa_pattern-th layer is global
    rope_base_swa: float = 1000.0
    rope_freqs: bool = False    # llama3-style per-pair RoPE divisors (rope_freqs.weight)
    rope_linear: float = 1.0    # linear RoPE scaling factor (rope.scaling.type linear)

    def is_swa(self, layer: int) -> bool:
        return self.arch == "gemma3" and self.swa_window > 0 and layer % self.swa_pattern < self.swa_pattern - 1


K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")  # rows must be multiples of 256
# "mixed": a type per tensor kind, as llama.cpp's Q4_K_M files mix them; fused
# matmuls (q/k/v, gate/up) then need both activation formats at once.
MIXED = {"attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_gate": "Q5_1",
         "ffn_up": "Q6_K", "ffn_down": "Q6_K", "token_embd": "Q6_K", "output": "Q8_0"}


def tensor_type(cfg: TinyConfig, name: str) -> str:
    """The weight type of a 2-D tensor in this config."""
    if cfg.wtype != "mixed":
        return cfg.wtype
    kind = name.split(".")[-2]
    return MIXED.get(kind, "Q8_0")


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


def make_weights(cfg: TinyConfig, seed: int = 0, n_vocab: int | None = None) -> dict[str, np.ndarray]:
    """n_vocab: rows of token_embd (and output); the byte vocabulary's by default."""
    rng = np.random.default_rng(seed)
    n_vocab = n_vocab or len(byte_vocab())
    qd, kd = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": mat(n_vocab, cfg.n_embd), "output_norm.weight": norm(cfg.n_embd)}
    if cfg.arch == "gemma3":  # its embeddings are scaled up by sqrt(n_embd): keep the residual stream sane
        w["token_embd.weight"] /= np.float32(np.sqrt(cfg.n_embd))
    if not cfg.tied:
        w["output.weight"] = mat(n_vocab, cfg.n_embd)
    if cfg.rope_freqs:
        w["rope_freqs.weight"] = (1 + 3 * rng.random(cfg.head_dim // 2)).astype(np.float32)
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
        if cfg.arch in ("qwen3", "gemma3"):
            w[p + "attn_q_norm.weight"] = norm(cfg.head_dim)
            w[p + "attn_k_norm.weight"] = norm(cfg.head_dim)
        if cfg.arch == "gemma3":
            w[p + "post_attention_norm.weight"] = norm(cfg.n_embd)
            w[p + "post_ffw_norm.weight"] = norm(cfg.n_embd)
        w[p + "ffn_norm.weight"] = norm(cfg.n_embd)
        w[p + "ffn_gate.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_up.weight"] = mat(cfg.n_ff, cfg.n_embd)
        w[p + "ffn_down.weight"] = mat(cfg.n_embd, cfg.n_ff)
        if cfg.arch == "phi3":  # fused: attn_qkv = [q; k; v], ffn_up = [gate; up]
            w[p + "attn_qkv.weight"] = np.concatenate([w.pop(p + f"attn_{x}.weight") for x in "qkv"])
            w[p + "ffn_up.weight"] = np.concatenate([w.pop(p + "ffn_gate.weight"), w.pop(p + "ffn_up.weight")])
    return w


def unfused(cfg: TinyConfig, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """phi3's fused tensors split into llama's (the reference reads those)."""
    w = dict(w)
    qd, kd = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in w:
            qkv = w.pop(p + "attn_qkv.weight")
            w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = np.split(qkv, [qd, qd + kd])
        if p + "ffn_gate.weight" not in w:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = np.split(w[p + "ffn_up.weight"], 2)
    return w


def copy_bpe_tokenizer(w: gguf.GGUFWriter, source: Path) -> None:
    """The GPT-2-style BPE tokenizer of the GGUF at `source` (SmolLM2's: one llama.cpp loads too)."""
    r = gguf.GGUFReader(str(source))
    field = lambda key: r.fields[key].contents()  # noqa: E731
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    w.add_token_list(field("tokenizer.ggml.tokens"))
    w.add_token_types(field("tokenizer.ggml.token_type"))
    w.add_token_merges(field("tokenizer.ggml.merges"))
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unknown", w.add_unk_token_id)):
        if f"tokenizer.ggml.{key}_token_id" in r.fields:
            add(field(f"tokenizer.ggml.{key}_token_id"))
    w.add_add_bos_token(False)


def write_gguf(path: Path, cfg: TinyConfig, weights: dict[str, np.ndarray],
               raw: dict[str, gguf.GGMLQuantizationType] | None = None,
               tokenizer_from: Path | None = None) -> dict[str, np.ndarray]:
    """Write the model; returns the weights as the file holds them (after rounding).

    `raw` stores the named tensors as zero bytes of another type (to test types
    the engine refuses). `tokenizer_from`: copy that GGUF's BPE tokenizer instead
    of the byte vocabulary (the weights then need its n_vocab, make_weights)."""
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
    if cfg.arch == "gemma3" and cfg.swa_window:
        w.add_sliding_window(cfg.swa_window)
        w.add_uint32(f"{cfg.arch}.attention.sliding_window_pattern", cfg.swa_pattern)
        w.add_float32(f"{cfg.arch}.rope.freq_base_swa", cfg.rope_base_swa)
    if cfg.rope_linear != 1.0:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope_linear)
    if tokenizer_from is not None:
        copy_bpe_tokenizer(w, tokenizer_from)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(byte_vocab())
        w.add_token_types([1] * 257 + [3, 3])
        w.add_token_merges(["a b"])
        w.add_bos_token_id(257)
        w.add_eos_token_id(258)
        w.add_add_bos_token(False)
    stored = {}
    for name, arr in weights.items():
        wtype = tensor_type(cfg, name) if arr.ndim == 2 else "F32"
        qtype = gguf.GGMLQuantizationType[wtype]
        if raw and name in raw:
            block, size = gguf.GGML_QUANT_SIZES[raw[name]]
            data = np.zeros((arr.shape[0], arr.shape[1] // block * size), np.uint8)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw[name])
        elif wtype != "F32":
            if wtype == "F16":
                data = arr.astype(np.float16)
                w.add_tensor(name, data)
                stored[name] = data.astype(np.float32)
            elif wtype in K_QUANTS:
                data = kquant_numpy.quantize(arr, qtype)
                w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
                stored[name] = kquant_numpy.dequantize(data, qtype, arr.shape[1])
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


def write_tiny_models(folder: Path, seeds=(1, 2)) -> list[Path]:
    """One tiny model per seed, ``tiny-<seed>.gguf``: same shapes, other weights."""
    paths = []
    for seed in seeds:
        cfg = TinyConfig()
        path = folder / f"tiny-{seed}.gguf"
        write_gguf(path, cfg, make_weights(cfg, seed=seed))
        paths.append(path)
    return paths


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


def round_act(x: np.ndarray, wtype: str) -> np.ndarray:
    """x (float32, then) as a matmul with `wtype` weights takes it: rounded to f16 for F16 and
    to bf16 for BF16, as llama.cpp (quant.h round_row_f16 / round_row_bf16); others as they are."""
    x32 = np.asarray(x, np.float32)
    if wtype == "F16":
        with np.errstate(over="ignore"):
            return x32.astype(np.float16).astype(np.float64)
    if wtype == "BF16":  # ggml_compute_fp32_to_bf16
        u = x32.view(np.uint32)
        nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        r = np.where(nan, u | np.uint32(0x00400000), u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))))
        return (r & np.uint32(0xFFFF0000)).astype(np.uint32).view(np.float32).astype(np.float64)
    return np.asarray(x, np.float64)


def reference_logits(cfg: TinyConfig, w: dict[str, np.ndarray], tokens: list[int], kv: str = "f16",
                     act_round: bool = False) -> np.ndarray:
    """Plain float64 transformer; K and V rounded as the engine stores them in a
    page of KV dtype `kv` (f16; q8: both 8-bit; vq8: K f16, V 8-bit); with act_round,
    the input of each F16 / BF16 matmul rounded to its type first (round_act)."""
    f = lambda a: a.astype(np.float64)  # noqa: E731
    hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_head_kv

    def mm(h, name):  # h @ W^T
        return (round_act(h, tensor_type(cfg, name)) if act_round else h) @ f(w[name]).T

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.eps) * g

    def angles(base, local):
        inv = base ** (-np.arange(0, hd, 2) / hd)
        if not local and "rope_freqs.weight" in w:
            inv = inv / f(w["rope_freqs.weight"])
        ang = np.arange(len(tokens))[:, None] * inv[None, :]
        return ang if local else ang / cfg.rope_linear

    def rope(v, local=False):  # v: (T, heads, hd)
        ang = angles(cfg.rope_base_swa, True) if local else angles(cfg.rope_base, False)
        cos, sin = np.cos(ang), np.sin(ang)
        out = v.copy()
        if cfg.arch in ("qwen2", "qwen3", "gemma3", "phi3"):
            a, b = v[..., : hd // 2], v[..., hd // 2:]
            out[..., : hd // 2] = a * cos[:, None] - b * sin[:, None]
            out[..., hd // 2:] = a * sin[:, None] + b * cos[:, None]
        else:
            a, b = v[..., 0::2], v[..., 1::2]
            out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
            out[..., 1::2] = a * sin[:, None] + b * cos[:, None]
        return out

    w = unfused(cfg, w)
    T = len(tokens)
    gemma = cfg.arch == "gemma3"
    x = f(w["token_embd.weight"])[tokens] * (np.sqrt(np.float32(cfg.n_embd)) if gemma else 1.0)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    pos = np.arange(T)
    window_mask = np.where(pos[:, None] - pos[None, :] >= max(cfg.swa_window, 1), -np.inf, 0.0) + mask
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = rms(x, f(w[p + "attn_norm.weight"]))
        q = mm(h, p + "attn_q.weight")
        k = mm(h, p + "attn_k.weight")
        v = mm(h, p + "attn_v.weight")
        if cfg.arch == "qwen2":
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if cfg.arch in ("qwen3", "gemma3"):
            q, k = rms(q, f(w[p + "attn_q_norm.weight"])), rms(k, f(w[p + "attn_k_norm.weight"]))
        local = cfg.is_swa(i)
        q, k = rope(q, local), rope(k, local)
        k = kv8_round(k) if kv == "q8" else f(k.astype(np.float16))
        v = kv8_round(v) if kv in ("q8", "vq8") else f(v.astype(np.float16))
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh] @ k[:, g].T / np.sqrt(hd) + (window_mask if local else mask)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g]
        o = mm(att.reshape(T, nh * hd), p + "attn_output.weight")
        x = x + (rms(o, f(w[p + "post_attention_norm.weight"])) if gemma else o)
        h = rms(x, f(w[p + "ffn_norm.weight"]))
        gt = mm(h, p + "ffn_gate.weight")
        up = mm(h, p + "ffn_up.weight")
        if gemma:  # tanh GELU
            act = 0.5 * gt * (1 + np.tanh(np.sqrt(2 / np.pi) * (gt + 0.044715 * gt ** 3)))
        else:
            act = gt / (1 + np.exp(-gt))
        o = mm(act * up, p + "ffn_down.weight")
        x = x + (rms(o, f(w[p + "post_ffw_norm.weight"])) if gemma else o)
    return mm(rms(x, f(w["output_norm.weight"])), "output.weight" if "output.weight" in w else "token_embd.weight")
