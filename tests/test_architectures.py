"""Every architecture and weight type the engine claims, on tiny synthetic
models, against a float64 numpy transformer (tests/tiny_models.py)."""
import numpy as np
import pytest

from ctxengine.engine.model import LoadedModel
from tiny_models import TinyConfig, make_weights, reference_logits, write_gguf

TOKENS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67, 1, 2, 3, 200]

# Float weights: only activation and KV rounding separate us from float64.
# Quantized weights: activations are quantized to 8 bits too (as llama.cpp does).
CASES = [
    ("llama", "F32", 2e-3), ("llama", "F16", 2e-3), ("llama", "BF16", 2e-3),
    ("qwen2", "F32", 2e-3), ("qwen3", "F32", 2e-3),
    ("llama", "Q8_0", 0.05), ("llama", "Q4_0", 0.08), ("llama", "Q4_1", 0.08),
]


@pytest.mark.parametrize("arch,wtype,tol", CASES)
def test_forward_matches_numpy_reference(tmp_path, arch, wtype, tol):
    cfg = TinyConfig(arch=arch, wtype=wtype, tied=wtype != "Q4_0")
    stored = write_gguf(tmp_path / "tiny.gguf", cfg, make_weights(cfg))
    ref = reference_logits(cfg, stored, TOKENS)
    m = LoadedModel(tmp_path / "tiny.gguf", threads=2)
    ours = m.forward(m.new_sequence(), TOKENS, all_logits=True)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    print(f"{arch} {wtype}: max |ours - ref| / max |ref| = {err:.2e}")
    assert err < tol
    assert (ours.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.9
    m.close()
