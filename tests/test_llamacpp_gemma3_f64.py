"""Which engine is right where ours and llama.cpp disagree on Gemma 3?

A third reference decides: a float64 numpy forward pass over the same
weights, dequantized by gguf (tests/gemma3_numpy.py), for the first POSITIONS
positions of the long text. Both engines quantize activations to 8 bits for
their integer matmuls and round attention's operands to f16, so neither
equals it; the test measures each one's distance to it (top-1 agreement with
its argmax, mean |Δ log p| at that token). Since our Q6_K follows llama.cpp's
tiled gemm (issue 19) the two engines give the same logits here, so the same
distance (measured: top-1 0.963, mean |Δ log p| 0.0462 each): ours is no
farther, within a hair (a llama.cpp built for other SIMD flags rounds a
little differently from the one measured).
"""
import numpy as np
import pytest

import ctxengine as ce
from agreement import Agreement, log_softmax
from gemma3_numpy import float64_logits

POSITIONS = 320


@pytest.fixture(scope="module")
def ids(gemma3_ref) -> list[int]:
    return gemma3_ref["long"][0]["ids"][:POSITIONS]


@pytest.fixture(scope="module")
def exact(gemma3_path, ids) -> dict:
    lp = log_softmax(float64_logits(gemma3_path, ids))
    return {"top1": lp.argmax(axis=1), "top1_lp": lp.max(axis=1)}


def distance(logits: np.ndarray, exact: dict, label: str) -> Agreement:
    a = Agreement()
    a.add(label, 0, logits, exact["top1"], exact["top1_lp"])
    return a


@pytest.fixture(scope="module")
def distances(gemma3_path, ids, exact, llamacpp) -> dict:
    m = ce.load(gemma3_path, threads=2)
    ours = distance(m.engine.forward(m.engine.new_sequence(), ids, all_logits=True), exact, "ours")
    m.close()
    theirs = distance(llamacpp.run(gemma3_path, [{"kind": "logits", "ids": ids}])[0]["logits"], exact, "llama.cpp")
    for name, a in (("ours", ours), ("llama.cpp", theirs)):
        print(f"Gemma 3 vs float64 numpy, {POSITIONS} positions: {name} {a.summary()}")
    return {"ours": ours, "llama.cpp": theirs}


def test_both_engines_distance_to_the_float64_forward_is_measured_and_close(distances):
    """Measured: ours and llama.cpp both 0.963 / 0.0462 (docs/PERFORMANCE.md)."""
    ours, theirs = distances["ours"], distances["llama.cpp"]
    assert ours.mean_gap <= theirs.mean_gap + 0.005, f"ours {ours.summary()}; llama.cpp {theirs.summary()}"
    assert ours.top1 >= theirs.top1 - 0.01, f"ours {ours.summary()}; llama.cpp {theirs.summary()}"


def test_ours_is_no_farther_from_the_float64_forward_than_llama_cpp(distances):
    ours, theirs = distances["ours"], distances["llama.cpp"]
    assert ours.mean_gap <= theirs.mean_gap + 1e-4, f"ours {ours.summary()}; llama.cpp {theirs.summary()}"
    assert ours.top1 >= theirs.top1 - 1 / POSITIONS, f"ours {ours.summary()}; llama.cpp {theirs.summary()}"
