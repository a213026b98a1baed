"""SmolLM2 Q4_1 against llama.cpp, live: the full-vocabulary logits at every
position of four texts (one of about 1,900 tokens), compared bit for bit.

llama.cpp evaluates them in batches of 512, as its own eval does; ours in one
call. The claim (docs/PERFORMANCE.md) is that every logit is equal, so the
assertion is max |Δ| == 0; the test prints the largest difference and where.
"""
import numpy as np
import pytest

import ctxengine as ce


@pytest.fixture(scope="module")
def smol(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def texts(smollm2_ref) -> list[str]:
    long = [c["text"] for c in smollm2_ref["long"]]
    assert any(len(c["ids"]) > 1000 for c in smollm2_ref["long"]), "one text must run past 1,000 tokens"
    return [c["text"] for c in smollm2_ref["teacher"]] + long


def test_tokenizer_matches_llama_cpp_live(smol, texts, smollm2_ref, llamacpp, smollm2_path):
    every = texts + [c["text"] for c in smollm2_ref["tokenize"]]
    theirs = llamacpp.run(smollm2_path, [{"kind": "tokenize", "texts": every}])[0]["ids"]
    for text, want in zip(every, theirs):
        assert smol.tokenize(text) == want, f"{text[:40]!r}"


def test_full_vocabulary_logits_equal_llama_cpp_bit_for_bit(smol, texts, llamacpp, smollm2_path):
    worst = (0.0, None)
    n_positions = n_differ = 0
    for k, text in enumerate(texts):
        ids = smol.tokenize(text, add_bos=smol.tokenizer.add_bos)
        theirs = llamacpp.run(smollm2_path, [{"kind": "logits", "ids": ids}])[0]["logits"]
        ours = smol.engine.forward(smol.engine.new_sequence(), ids, all_logits=True)
        assert ours.shape == theirs.shape == (len(ids), smol.config.n_vocab)
        delta = np.abs(ours.astype(np.float64) - theirs)
        pos, tok = np.unravel_index(int(np.argmax(delta)), delta.shape)
        if delta[pos, tok] > worst[0]:
            worst = (float(delta[pos, tok]), (k, int(pos), int(tok)))
        n_positions += len(ids)
        n_differ += int(np.count_nonzero(ours.view(np.uint32) != theirs.view(np.uint32)))
        del theirs, ours, delta
    print(f"SmolLM2 Q4_1 vs llama.cpp: {n_positions} positions x {smol.config.n_vocab} logits, "
          f"{n_differ} differ in any bit; max |d logit| {worst[0]:.3g} at (text, position, token) {worst[1]}")
    assert n_positions > 1000 + 3
    assert worst[0] == 0 and n_differ == 0, f"max |d logit| {worst[0]:.3g} at {worst[1]}; {n_differ} logits differ"
