"""Gemma 3 270M Q4_K_M, matmul by matmul, against llama.cpp live: each
quantized weight (Q5_0, Q8_0, Q4_K, Q6_K) times the very activations
llama.cpp fed it (scripts/llamacpp_matmuls.py catches both in its graph),
through our kernels on every SIMD path, must give llama.cpp's output bit for
bit. Everything else in the layer (norms, RoPE, attention, GeGLU) was found
equal too, so this is where Gemma parted from llama.cpp (issue 19): its Q6_K
ffn_down, which llama.cpp multiplies by its tiled K-quant gemm for 8 rows or
more, not by vec_dot (one float rounding apart, then amplified through 18
layers' 8-bit activation quantizations into a mean |Δ log p| of 0.056).

16 positions: one batch past the 8 rows at which llama.cpp takes its batched
kernels, as its prefill does.
"""
import numpy as np
import pytest

from ctxengine import _core
from ctxengine.engine.gguf_file import open_gguf
from simd_paths import EVERY_PATH

POSITIONS = 16


@pytest.fixture(scope="module")
def matmuls(llamacpp, gemma3_path, gemma3_ref) -> dict:
    return llamacpp.matmuls(gemma3_path, gemma3_ref["long"][0]["ids"][:POSITIONS])


@pytest.fixture(scope="module")
def weights(gemma3_path):
    with open_gguf(gemma3_path) as f:
        yield dict(f.tensors)


def test_llama_cpp_multiplies_every_weight_type_of_the_file(matmuls, weights):
    types = {weights[name].type_name for name in matmuls}
    assert types == {"Q5_0", "Q8_0", "Q4_K", "Q6_K"}, types
    assert len(matmuls) == 18 * 7 + 1  # q, k, v, o, gate, up, down a layer; the tied output
    assert all(x.shape == (POSITIONS, weights[n].shape[0]) for n, (x, _) in matmuls.items())


@pytest.mark.parametrize("isa", EVERY_PATH)
def test_every_matmul_equals_llama_cpps_bit_for_bit(isa, matmuls, weights):
    _core.set_isa(isa)
    try:
        for name, (x, want) in matmuls.items():
            t = weights[name]
            got = _core.quant.matmul(t.ggml_type, t.data, t.shape[0], t.shape[1], x)
            differ = got.view(np.uint32) != want.view(np.uint32)
            assert not differ.any(), (f"{name} ({t.type_name}) on {isa}: {differ.sum()} of {differ.size} differ, "
                                      f"max |d| {np.abs(got - want).max():.3g}")
    finally:
        _core.set_isa(_core.detect_isa())
