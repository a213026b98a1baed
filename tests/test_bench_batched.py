"""bench/bench_batched.py's measurements (ctxengine/bench/batched.py): streams and
branches decoding in shared steps give the tokens each gives alone, whether the
branches share their prefix's pages or hold copies, at any thread count."""
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.bench.batched import Branches, Streams, copy_sequence, decode_together
from ctxengine.engine.engine import Engine
from tiny_models import TinyConfig, make_weights, write_gguf


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m.engine
    m.close()


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """A sliding-window model whose 16-token window releases pages early."""
    cfg = TinyConfig(arch="gemma3", n_layer=4, swa_window=16, swa_pattern=2, n_ctx=512)
    path = tmp_path_factory.mktemp("batched") / "tiny-gemma3.gguf"
    write_gguf(path, cfg, make_weights(cfg))
    return path


def test_a_streams_tokens_do_not_depend_on_how_many_share_its_steps(smollm2):
    st = Streams(smollm2, 5, 24)
    alone = [st.decode(1, 6).tokens[0]]
    together = st.decode(5, 6).tokens
    assert together[0] == alone[0]
    # Stream s alone: decode a fresh fork of its prompt by itself.
    for s in range(1, 5):
        assert decode_together(smollm2, [st.bases[s].fork()], [st.first[s]], 6).tokens[0] == together[s]


def test_branches_shared_or_copied_decode_the_same_tokens(smollm2):
    br = Branches(smollm2, 4, 70)
    forks = [br.prefix.fork() for _ in range(2)]
    copies = [copy_sequence(smollm2, br.prefix) for _ in range(2)]
    assert forks[0].pages == forks[1].pages == br.prefix.pages  # shared, copy-on-write
    assert not set(copies[0].pages) & set(copies[1].pages) and not set(copies[0].pages) & set(br.prefix.pages)
    assert [c.n_tokens for c in copies] == [br.prefix.n_tokens] * 2
    shared = br.decode(True, 5).tokens
    assert br.decode(False, 5).tokens == shared
    for b, first in enumerate(br.first):
        assert decode_together(smollm2, [br.prefix.fork()], [first], 5).tokens[0] == shared[b]


def test_branches_over_released_pages_at_any_thread_count(tiny_gemma):
    seen = []
    for threads in (1, 2):
        eng = Engine(tiny_gemma, threads=threads)
        try:
            br = Branches(eng, 3, 100)
            assert br.prefix.n_released > 0  # the copies must carry the trim pool's pages too
            copy = copy_sequence(eng, br.prefix)
            assert copy.n_released == br.prefix.n_released and copy.n_tokens == br.prefix.n_tokens
            rows = [np.empty((1, eng.config.n_vocab), np.float32) for _ in range(2)]
            eng._core.forward([(s, np.array([7], np.int32), buf, False, None)
                               for s, buf in zip((br.prefix.fork(), copy), rows)])
            assert np.array_equal(rows[0], rows[1])
            shared = br.decode(True, 4).tokens
            assert br.decode(False, 4).tokens == shared
            seen.append(shared)
        finally:
            eng.close()
    assert seen[0] == seen[1]


@pytest.mark.parametrize("n_seq", [16, 20, 32, 33])
def test_many_streams_logits_bits_equal_each_alone(smollm2, n_seq):
    """One step of many sequences (the output matrix's rows kernel by bands of
    weight rows at 17-32 rows, the prefill tiles past that) gives each the
    logits bits it gets alone."""
    st = Streams(smollm2, n_seq, 8)
    last = [(t * 7 + 3) % 1000 for t in range(n_seq)]

    def step(seqs, toks):
        bufs = [np.empty((1, smollm2.config.n_vocab), np.float32) for _ in seqs]
        smollm2._core.forward([(s, np.array([t], np.int32), b, False, None) for s, t, b in zip(seqs, toks, bufs)])
        return bufs

    together = step([b.fork() for b in st.bases], last)
    for s in (0, 1, n_seq // 2, n_seq - 1):
        alone = step([st.bases[s].fork()], [last[s]])[0]
        np.testing.assert_array_equal(alone.view(np.uint32), together[s].view(np.uint32))
