"""Every architecture and weight type the engine claims, on tiny synthetic
models, against a float64 numpy transformer (tests/tiny_models.py)."""
import numpy as np
import pytest

from ctxengine.engine.engine import Engine
from tiny_models import TinyConfig, make_weights, reference_logits, write_gguf

TOKENS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67, 1, 2, 3, 200]

# Float weights: only activation and KV rounding separate us from float64.
# Quantized weights: activations are quantized to 8 bits too (as llama.cpp does).
CASES = [
    # BF16: its matmuls take activations rounded to bf16, as llama.cpp's do (model.cpp
    # Model::matmul), 2^-8 apart, which the float64 reference does not round.
    ("llama", "F32", 2e-3), ("llama", "F16", 2e-3), ("llama", "BF16", 1e-2),
    ("qwen2", "F32", 2e-3), ("qwen3", "F32", 2e-3),
    ("llama", "Q8_0", 0.05), ("llama", "Q4_0", 0.08), ("llama", "Q4_1", 0.08),
    ("llama", "Q5_0", 0.08), ("llama", "Q5_1", 0.08),
]
# K-quant rows are whole super-blocks of 256: a wider tiny model. Their
# activations are quantized to 8 bits with one scale per 256 (Q8K).
K_CASES = [("llama", t, 0.06) for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "mixed")]
WIDE = dict(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=256)


def check_against_numpy(tmp_path, cfg: TinyConfig, tol: float) -> None:
    stored = write_gguf(tmp_path / "tiny.gguf", cfg, make_weights(cfg))
    ref = reference_logits(cfg, stored, TOKENS)
    m = Engine(tmp_path / "tiny.gguf", threads=2)
    assert m.config.swa_window == cfg.swa_window
    ours = m.forward(m.new_sequence(), TOKENS, all_logits=True)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    print(f"{cfg}: max |ours - ref| / max |ref| = {err:.2e}")
    assert err < tol
    assert (ours.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.9
    m.close()


@pytest.mark.parametrize("arch,wtype,tol", CASES + K_CASES)
def test_forward_matches_numpy_reference(tmp_path, arch, wtype, tol):
    wide = WIDE if (arch, wtype, tol) in K_CASES else {}
    cfg = TinyConfig(arch=arch, wtype=wtype, tied=wtype not in ("Q4_0", "mixed"), **wide)
    check_against_numpy(tmp_path, cfg, tol)


# Phi-3: llama with NeoX RoPE and fused attn_qkv / gate-and-up tensors.
# Gemma 3: scaled embeddings, q/k norms, post-attention and post-FFN norms,
# GeGLU, and (with a window of 5 over 20 tokens) sliding-window local layers
# with their own RoPE base beside a global one. Llama 3.x: per-pair RoPE
# divisors (rope_freqs.weight); linear RoPE scaling.
EXTRA = [
    ("gemma3", dict(swa_window=5, n_layer=3), 3e-3),
    ("gemma3", dict(swa_window=0, n_layer=2), 3e-3),
    ("gemma3", dict(swa_window=5, n_layer=3, n_head_kv=1, wtype="Q8_0"), 0.05),
    ("gemma3", dict(WIDE, swa_window=5, n_layer=3, n_head_kv=1, wtype="mixed"), 0.06),  # as the Q4_K_M file
    ("llama", dict(rope_freqs=True, tied=False), 2e-3),
    ("llama", dict(rope_linear=4.0), 2e-3),
    ("phi3", dict(tied=False), 2e-3),
    ("phi3", dict(wtype="Q8_0"), 0.05),
]


@pytest.mark.parametrize("arch,opts,tol", EXTRA, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(EXTRA)])
def test_architecture_options_match_numpy_reference(tmp_path, arch, opts, tol):
    check_against_numpy(tmp_path, TinyConfig(arch=arch, **opts), tol)


def test_sliding_window_changes_the_result(tmp_path):
    """The window is really applied: a window wider than the prompt gives the
    same bits inside the small window and other logits past it."""
    outs = []
    for window in (5, 100):
        cfg = TinyConfig(arch="gemma3", swa_window=window, n_layer=3)
        write_gguf(tmp_path / f"w{window}.gguf", cfg, make_weights(cfg))
        m = Engine(tmp_path / f"w{window}.gguf", threads=1)
        outs.append(m.forward(m.new_sequence(), TOKENS, all_logits=True))
        m.close()
    np.testing.assert_array_equal(outs[0][:5], outs[1][:5])  # inside the window: identical bits
    assert np.abs(outs[0][5:] - outs[1][5:]).max() > 1e-3
