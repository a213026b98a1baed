"""Q8_0 repacked 8 rows to a group for one-row products (quant.h repack_q8_0x8):
the layout as documented, every path's product over it bit for bit the product
over the rows, and a model's logits the same with the copy as without it."""
import numpy as np
import pytest

import ctxengine as ce
import ctxengine.engine.engine as engine_module
from ctxengine import _core

Q = _core.quant
Q8_0 = 8
BLOCK = 34  # f16 d, 32 int8


def q8_0_rows(rng, n_in, n_out):
    """Random Q8_0 rows whose scales are finite halves (the exponent never all ones)."""
    w = rng.integers(0, 256, n_out * (n_in // 32) * BLOCK, dtype=np.uint8)
    d = w.reshape(n_out, n_in // 32, BLOCK)[:, :, :2]
    d[:, :, 1] &= 0x3F  # |d| < 2: no Inf / NaN
    return w


def repack_numpy(w, n_in, n_out):
    """quant.h's layout, spelled out: groups of 8 rows; per group and block, the 8
    rows' f16 d, then their 32 qs each; the last group padded with zero rows."""
    nb = n_in // 32
    groups = -(-n_out // 8)
    rows = np.zeros((groups * 8, nb, BLOCK), np.uint8)
    rows[:n_out] = w.reshape(n_out, nb, BLOCK)
    g = rows.reshape(groups, 8, nb, BLOCK).transpose(0, 2, 1, 3)  # (group, block, row, bytes)
    return np.concatenate([g[..., :2].reshape(groups, nb, 16), g[..., 2:].reshape(groups, nb, 256)], axis=2).ravel()


@pytest.mark.parametrize("n_in,n_out", [(64, 8), (640, 37), (576, 200), (2048, 5)])
def test_the_layout_is_the_documented_one(n_in, n_out):
    w = q8_0_rows(np.random.default_rng(n_out), n_in, n_out)
    P = Q.repack_q8_0x8(w, n_in, n_out)
    assert P.nbytes == -(-n_out // 8) * 8 * (n_in // 32) * BLOCK
    assert P.tobytes() == repack_numpy(w, n_in, n_out).tobytes()


def paths():
    have = {"scalar", _core.active_isa()} | ({"avx2"} if _core.active_isa() == "avx512" else set())
    return [p for p in ("scalar", "avx2", "avx512") if p in have]


@pytest.fixture
def each_path():
    before = _core.active_isa()
    yield paths()
    _core.set_isa(before)


@pytest.mark.parametrize("n_in,n_out", [(640, 264), (64, 37), (576, 200), (1536, 16), (32, 9)])
def test_products_over_the_copy_equal_the_rows_on_every_path(each_path, n_in, n_out):
    rng = np.random.default_rng(n_in + n_out)
    w = q8_0_rows(rng, n_in, n_out)
    P = Q.repack_q8_0x8(w, n_in, n_out)
    ranges = [(0, n_out, 0), (3, n_out - 5, 0), (5, n_out, 7), (0, n_out, 16), (1, n_out, 3), (8, 8, 0)]
    for isa in each_path:
        _core.set_isa(isa)
        for n_x in (1, 2, 17):
            x = (rng.standard_normal((n_x, n_in)) * rng.uniform(0.01, 50)).astype(np.float32)
            for o0, o1, chunk in ranges:
                o1 = max(o0, o1)
                rows = Q.matmul(Q8_0, w, n_in, n_out, x, o0, o1, chunk)
                copy = Q.matmul(Q8_0, w, n_in, n_out, x, o0, o1, chunk, x8=P)
                assert copy.tobytes() == rows.tobytes(), (isa, n_x, o0, o1, chunk)


def test_a_copy_of_the_wrong_size_is_refused():
    w = q8_0_rows(np.random.default_rng(0), 64, 16)
    x = np.ones((1, 64), np.float32)
    with pytest.raises(ValueError, match="x8 has"):
        Q.matmul(Q8_0, w, 64, 16, x, x8=np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="x8"):
        Q.matmul(2, np.zeros(16 * 2 * 18, np.uint8), 64, 16, x, x8=Q.repack_q8_0x8(w, 64, 16))


def load(path, threads, repack, monkeypatch):
    plain = engine_module.asdict
    monkeypatch.setattr(engine_module, "asdict", lambda cfg: {**plain(cfg), "repack_output": repack})
    model = ce.load(path, threads=threads)
    monkeypatch.setattr(engine_module, "asdict", plain)
    assert model.engine._core.output_repacked == repack
    return model


def greedy_logits(model, n_prompt=40, n_gen=12):
    eng = model.engine
    ids = eng.tokenize("The lighthouse keeper counted the ships that passed in the night, one by one, " * 3)
    seq = eng.new_sequence()
    rows = [eng.forward(seq, ids[:n_prompt])]
    for _ in range(n_gen):
        rows.append(eng.forward(seq, [int(np.argmax(rows[-1]))]))
    return [r.tobytes() for r in rows]


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_model_logits_are_the_same_with_the_copy(which, smollm2_path, gemma3_path, monkeypatch, each_path):
    path = smollm2_path if which == "smollm2" else gemma3_path
    for isa in each_path[-2:]:  # the CPU's own path and the one below it
        _core.set_isa(isa)
        want = None
        for threads in (1, 2):
            for repack in (False, True):
                model = load(path, threads, repack, monkeypatch)
                got = greedy_logits(model)
                model.close()
                want = want or got
                assert got == want, (isa, threads, repack)
