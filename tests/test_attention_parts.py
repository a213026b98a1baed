"""Branches of one conversation decoding together split their attention by
parts of the KV (Model::attend_in_parts): each thread scores every row against
its share of the prefix's pages and sums its share of the value dimensions.
Gemma 3 (a head of 256, so every row is a bundle of its own) takes that path
whenever a step holds at least two branches a thread. Each branch must still
get, bit for bit, the logits it gets alone, with every KV dtype, on a prefix
longer than the sliding window (so the local layers start past page 0) and
forked mid-page (so each branch's last prefix page is its own copy)."""
import random

import numpy as np
import pytest

from ctxengine.engine.engine import Engine


@pytest.mark.parametrize("kv", ["f16", "q8", "vq8"])
@pytest.mark.parametrize("threads", [2, 3])
def test_branches_split_by_parts_get_their_own_logits_bit_for_bit(gemma3_path, kv, threads):
    eng = Engine(gemma3_path, threads=threads, kv=kv)
    try:
        rng = random.Random(26)
        V = eng.config.n_vocab
        prefix = eng.new_sequence()
        eng.forward(prefix, [rng.randrange(V) for _ in range(600)])  # past the 512-token window, mid-page
        n_branch = 2 * threads
        steps = [[rng.randrange(V) for _ in range(n_branch)] for _ in range(3)]
        alone = []
        for b in range(n_branch):
            seq = prefix.fork()
            alone.append([eng.forward(seq, [step[b]]).copy() for step in steps])
        forks = [prefix.fork() for _ in range(n_branch)]
        for i, step in enumerate(steps):
            bufs = [np.empty((1, V), np.float32) for _ in forks]
            eng._core.forward([(s, np.array([t], np.int32), buf, False, None) for s, t, buf in zip(forks, step, bufs)])
            for b, buf in enumerate(bufs):
                want = np.asarray(alone[b][i], np.float32).reshape(1, V)
                assert np.array_equal(buf.view(np.uint32), want.view(np.uint32)), (kv, threads, i, b)
    finally:
        eng.close()


@pytest.mark.parametrize("model,kv", [("smollm2", "f16"), ("smollm2", "q8"), ("gemma3", "f16"), ("gemma3", "vq8")])
def test_one_sequence_over_512_keys_gets_its_one_thread_logits_bit_for_bit(model, kv, smollm2_path, gemma3_path):
    """From 512 keys one sequence's decoded row keeps each KV head's queries in
    one task and splits its keys among the threads (Model::lone_and_long), so
    that each K and V line is read once, not once per head: the logits of
    every step, before and past the switch, are the one thread's."""
    path = smollm2_path if model == "smollm2" else gemma3_path
    rng = random.Random(34)
    got = {}
    for threads in (1, 2, 3):
        eng = Engine(path, threads=threads, kv=kv)
        try:
            if not got:
                ids = [rng.randrange(eng.config.n_vocab) for _ in range(502)]
            seq = eng.new_sequence()
            eng.forward(seq, ids[:490])
            # 491 to 502 keys: 31 pages of 16, then 32 (512 keys) from the 7th step
            got[threads] = np.stack([eng.forward(seq, [t]).copy() for t in ids[490:]])
        finally:
            eng.close()
    for threads in (2, 3):
        assert np.array_equal(got[threads].view(np.uint32), got[1].view(np.uint32)), (model, kv, threads)
