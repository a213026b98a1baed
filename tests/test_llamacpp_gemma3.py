"""Gemma 3 270M Q4_K_M past its 512-token sliding window, against llama.cpp.

The text (texts.json's "long": plain English prose) runs to 1,749 tokens,
so the window slides past more than twice. Teacher-forced, ours agrees with
llama.cpp at every position (top-1 1.0, mean |Δ log p(llama.cpp's top-1)|
under 1e-5) since our Q6_K follows llama.cpp's tiled gemm (issue 19,
test_llamacpp_gemma3_matmuls.py); the one position that differs at all is
the last, which llama.cpp's batch of 213 rows leaves to its one-row Q4_K gemv
(ours takes the batched order everywhere, quant.h). Against the stored
reference (an AVX-512 VNNI build of llama.cpp) that is asserted as measured;
against llama.cpp live, whose bits depend on its build's SIMD flags, the
issue's bar (top-1 >= 0.97, mean |Δ log p| < 0.05), where the live build is
an AVX-512 one: an AVX2-only build rounds differently (tests/llamacpp.py,
AVX2_BUILD_DIFFERS) and met only top-1 0.948, mean gap 0.058 on a Zen 3. The same holds through a
fork and a snapshot/restore taken at position 640, which give bit-identical
logits to the straight run. Greedy 32 tokens after the text equal llama.cpp's
or part at a near-tie.

Against the stored reference (its top 5 a position), so a bare machine still
checks it, and against llama.cpp live where it is installed.
"""
import hashlib

import numpy as np
import pytest

import ctxengine as ce
from agreement import NEAR_TIE, Agreement, first_parting, tie_gap
from llamacpp import require_avx512_build

FORK_AT = 640  # past the first window, not on a page boundary
CHUNK = 256    # positions per forward: bounds the (CHUNK, 262144) logits we hold at once
BAR_TOP1, BAR_GAP = 0.97, 0.05  # issue 19's bar, for an AVX-512 build of llama.cpp
STORED_GAP = 1e-3  # measured 4.9e-6 (2.4e-6 live: the last position's 0.0042 alone; the stored values are rounded)


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    m = ce.load(gemma3_path, threads=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def long_case(gemma3_ref, gemma) -> dict:
    case = gemma3_ref["long"][0]
    assert case["ids"] == gemma.engine.tokenizer.with_bos(gemma.tokenize(case["text"]))
    assert len(case["ids"]) >= 1500 and len(case["ids"]) > 3 * gemma.config.swa_window
    return case


@pytest.fixture(scope="module")
def live(llamacpp, gemma3_path, long_case) -> dict:
    require_avx512_build(llamacpp)
    top, greedy = llamacpp.run(gemma3_path, [{"kind": "top", "ids": long_case["ids"], "k": 40},
                                             {"kind": "greedy", "ids": long_case["ids"], "n": 32}])
    return {"top1": top["top_ids"][:, 0], "top1_lp": top["top_logprobs"][:, 0], "greedy": greedy["ids"]}


def teacher_forced(gemma, seq, ids: list[int], start: int, refs: dict) -> tuple[dict, list[bytes]]:
    """Feed ids[start:] to seq (which holds ids[:start]) CHUNK at a time; how it
    agrees with each reference at those positions, and a digest of every logits row."""
    agreements, digests = {name: Agreement() for name in refs}, []
    for s in range(start, len(ids), CHUNK):
        logits = gemma.engine.forward(seq, ids[s:s + CHUNK], all_logits=True)
        for name, ref in refs.items():
            agreements[name].add(name, s, logits, ref["top1"][s:s + len(logits)], ref["top1_lp"][s:s + len(logits)])
        digests.extend(hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in logits)
    return agreements, digests


@pytest.fixture(scope="module")
def references(long_case, request) -> dict:
    """The stored reference, and llama.cpp live where there is one."""
    refs = {"stored": {"top1": np.array([r[0] for r in long_case["top_ids"]]),
                       "top1_lp": np.array([r[0] for r in long_case["top_logprobs"]])}}
    try:
        refs["live"] = request.getfixturevalue("live")
    except pytest.skip.Exception:
        pass
    return refs


@pytest.fixture(scope="module")
def straight(gemma, long_case, references):
    return teacher_forced(gemma, gemma.engine.new_sequence(), long_case["ids"], 0, references)


def test_past_the_window_meets_the_bar(straight, long_case):
    for name, agreement in straight[0].items():
        print(f"Gemma 3 vs {name} llama.cpp, {len(long_case['ids'])} positions: {agreement.summary()}")
        assert agreement.top1 >= BAR_TOP1 and agreement.mean_gap < BAR_GAP, f"{name}: {agreement.summary()}"


def test_past_the_window_agrees_with_the_stored_reference_at_every_position(straight):
    """Ours is the same on every CPU (every SIMD path gives the same bits), so
    against the stored reference this holds anywhere, as measured."""
    agreement = straight[0]["stored"]
    assert agreement.top1 == 1.0 and agreement.mean_gap < STORED_GAP, agreement.summary()
    assert sum(gap > 1e-3 for gap in agreement.gaps) <= 1, agreement.summary()


def test_fork_and_restore_past_600_give_the_straight_runs_logits(gemma, long_case, references, straight, tmp_path):
    ids = long_case["ids"]
    trunk = gemma.context("trunk")
    trunk.append(ids[:FORK_AT])
    branch = trunk.fork("branch")
    with ce.Store(tmp_path / "store") as store:
        trunk.snapshot(store, ref="at-640")
        restored = gemma.restore(store, "at-640", name="restored")
    assert branch._seq.n_tokens == restored._seq.n_tokens == FORK_AT
    for ctx in (branch, restored):
        agreements, rows = teacher_forced(gemma, ctx._seq, ids, FORK_AT, references)
        assert rows == straight[1][FORK_AT:], f"{ctx.name}: logits differ from the straight run's"
        for name, agreement in agreements.items():
            print(f"Gemma 3 {ctx.name} at {FORK_AT} vs {name} llama.cpp: {agreement.summary()}")
            assert agreement.top1 >= BAR_TOP1 and agreement.mean_gap < BAR_GAP, agreement.summary()
    for ctx in (trunk, branch, restored):
        ctx.delete()


def test_greedy_past_the_window_matches_llama_cpp_or_parts_at_a_near_tie(gemma, long_case, live):
    ctx = gemma.context("greedy")
    ctx.append(long_case["ids"])
    before = ctx.fork("before")
    ours = [p.token_id for p in ctx.generate(32, temperature=0.0) if p.token_id is not None]
    k = first_parting(ours, live["greedy"])
    print(f"Gemma 3 greedy after {len(long_case['ids'])} tokens: ours {ours}; llama.cpp {live['greedy']}; parts at {k}")
    if k is None:
        assert len(ours) == len(live["greedy"])
    else:
        before.append(live["greedy"][:k])
        gap = tie_gap(before._sync(), ours[k], live["greedy"][k])
        assert gap < NEAR_TIE, f"step {k}: ours {ours[k]} vs llama.cpp {live['greedy'][k]}, gap {gap:.4f}"
    for c in (ctx, before):
        c.delete()
