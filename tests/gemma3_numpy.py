"""A third reference for Gemma 3 270M: tiny_models' float64 numpy forward
pass over the real model's weights, dequantized by gguf (gguf.quants), so
neither engine's kernels, rounding or reduction order are in it. Where ours
and llama.cpp disagree, the distance of each to this says which is closer
to the model the weights define."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from ctxengine.engine.config import ModelConfig
from ctxengine.engine.gguf_file import open_gguf
from tiny_models import TinyConfig, reference_logits


def config(path: Path) -> TinyConfig:
    with open_gguf(path) as f:
        c = ModelConfig.from_gguf(f)
    global_layers = [i for i, swa in enumerate(c.swa_layers) if not swa]
    pattern = global_layers[0] + 1
    assert c.arch == "gemma3" and global_layers == list(range(pattern - 1, c.n_layer, pattern))
    assert c.attn_scale == 1 / np.sqrt(c.head_dim) and c.logit_softcap == 0 and c.rope_dim == c.head_dim
    return TinyConfig(arch="gemma3", n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head, n_head_kv=c.n_head_kv,
                      head_dim=c.head_dim, n_ff=c.n_ff, n_ctx=c.n_ctx, rope_base=c.rope_base, eps=c.norm_eps,
                      swa_window=c.swa_window, swa_pattern=pattern, rope_base_swa=c.rope_base_swa)


def weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor as float32 (rows, cols), dequantized by gguf's own numpy code."""
    reader = GGUFReader(path)
    return {t.name: dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
            for t in reader.tensors}


def float64_logits(path: Path, tokens: list[int]) -> np.ndarray:
    """(len(tokens), n_vocab) float64 logits; K and V rounded to f16 as both engines store them."""
    return reference_logits(config(path), weights(path), tokens, kv="f16")
