"""SmolLM2 Q4_1 against llama.cpp, live: the full-vocabulary logits at every
position of four texts (one of about 1,900 tokens), compared bit for bit.

llama.cpp evaluates them in batches of 512, as its own eval does; ours in one
call. The claim (docs/PERFORMANCE.md) is that every logit is equal, so the
assertion is max |Δ| == 0; the test prints the largest difference and where.
"""
import numpy as np
import pytest

import ctxengine as ce
from llamacpp import require_avx512_build


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


def test_code_points_are_classed_as_llama_cpp_classes_them(smol, llamacpp, smollm2_path):
    # The pre-tokenizer's letters, digits, punctuation and whitespace are llama.cpp's tables',
    # whatever Unicode version the `regex` module knows: every code point the two disagree on,
    # a sample of the rest and the whitespace, each between a letter, a contraction and a digit.
    import random
    import re

    import regex

    from ctxengine.text.tokenizer_bpe import llama_classes

    ours = re.compile(llama_classes(r"\p{L}|\p{N}|\p{P}"))
    theirs = regex.compile(r"\p{L}|\p{N}|\p{P}")
    points = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    rng = random.Random(20261203)
    odd = [c for c in points if (ours.fullmatch(chr(c)) is None) != (theirs.fullmatch(chr(c)) is None)]
    spaces = [*range(0x9, 0xE), *range(0x1C, 0x21), 0x85, 0xA0, 0x1680, 0x180E, *range(0x2000, 0x200C),
              0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF]  # llama.cpp's whitespace, and some it is not
    texts = [f"a{chr(c)}'s {chr(c)}7" for c in odd[::7] + rng.sample(points, 3000) + spaces]
    texts += [f"a {chr(c)}{chr(c)} b{chr(c)}\n{chr(c)}" for c in spaces]
    want = llamacpp.run(smollm2_path, [{"kind": "tokenize", "texts": texts}])[0]["ids"]
    bad = [(t, smol.tokenize(t), w) for t, w in zip(texts, want) if smol.tokenize(t) != w]
    assert not bad, f"{len(bad)} of {len(texts)} differ, e.g. {bad[:3]}"


def test_full_vocabulary_logits_equal_llama_cpp_bit_for_bit(smol, texts, llamacpp, smollm2_path):
    require_avx512_build(llamacpp)
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
