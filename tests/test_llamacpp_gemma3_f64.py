"""Which engine is right where ours and llama.cpp disagree on Gemma 3?

A third reference decides: a float64 numpy forward pass over the same
weights, dequantized by gguf (tests/gemma3_numpy.py), for the first POSITIONS
positions of the long text. Both engines quantize activations to 8 bits for
their integer matmuls, so neither equals it; the test measures each one's
distance to it (top-1 agreement with its argmax, mean |Δ log p| at that
token) and asserts ours is no farther than llama.cpp's.
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


@pytest.mark.slow
def test_ours_is_no_farther_from_the_float64_forward_than_llama_cpp(gemma3_path, ids, exact, llamacpp):
    m = ce.load(gemma3_path, threads=2)
    ours = distance(m.engine.forward(m.engine.new_sequence(), ids, all_logits=True), exact, "ours")
    m.close()
    theirs = distance(llamacpp.run(gemma3_path, [{"kind": "logits", "ids": ids}])[0]["logits"], exact, "llama.cpp")
    print(f"Gemma 3 vs float64 numpy, {POSITIONS} positions: ours {ours.summary()}")
    print(f"Gemma 3 vs float64 numpy, {POSITIONS} positions: llama.cpp {theirs.summary()}")
    assert ours.mean_gap <= theirs.mean_gap, f"ours {ours.summary()}; llama.cpp {theirs.summary()}"
    assert ours.top1 >= theirs.top1, f"ours {ours.summary()}; llama.cpp {theirs.summary()}"
