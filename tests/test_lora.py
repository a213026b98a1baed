"""LoRA adapters in the engine: files as llama.cpp writes them, applied at run
time against a float64 numpy forward on merged weights, bit-identical across
threads, chunking, batching and SIMD paths, and refused when they do not fit."""
import math

import gguf
import numpy as np
import pytest

from ctxengine import _core
from ctxengine.engine.engine import Engine
from ctxengine.engine.lora import LoraSet
from ctxengine.errors import CtxError, ModelFileError
from lora_files import ALL, ATTN, FFN, merged, random_lora, write_lora
from tiny_models import TinyConfig, make_weights, reference_logits, write_gguf

TOKENS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67, 1, 2, 3, 200]
CFG = TinyConfig()
PATHS = ["scalar", "avx2", "avx512"]


def shapes(cfg: TinyConfig) -> dict:
    qd, kd, e, f = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_embd, cfg.n_ff
    return {"attn_q": (e, qd), "attn_k": (e, kd), "attn_v": (e, kd), "attn_output": (qd, e),
            "ffn_gate": (e, f), "ffn_up": (e, f), "ffn_down": (f, e)}


@pytest.fixture
def tiny(tmp_path):
    stored = write_gguf(tmp_path / "tiny.gguf", CFG, make_weights(CFG))
    engine = Engine(tmp_path / "tiny.gguf", threads=2)
    yield engine, stored
    engine.close()


def adapter_file(tmp_path, name, rank, targets=ALL, *, seed=1, alpha=0.0, dtype="F32", size=0.3):
    mats = random_lora(shapes(CFG), CFG.n_layer, rank, targets, seed=seed, size=size)
    path = tmp_path / f"{name}.gguf"
    return path, write_lora(path, CFG.arch, mats, alpha=alpha, dtype=dtype)


@pytest.mark.parametrize("rank,targets,dtype,alpha,scale", [
    (4, ALL, "F32", 8.0, 0.5),      # factor 0.5 * 8 / 4 = 1
    (8, ATTN, "F16", 0.0, 0.75),    # no alpha: the scale alone
    (3, FFN, "F32", 6.0, 1.0),      # an odd rank
    (32, FFN, "Q8_0", 64.0, 0.25),  # Q8_0 rows are blocks of 32: B's rank too
])
def test_matches_numpy_on_merged_weights(tmp_path, tiny, rank, targets, dtype, alpha, scale):
    engine, stored = tiny
    path, mats = adapter_file(tmp_path, "a", rank, targets, alpha=alpha, dtype=dtype)
    engine.load_lora("a", path)
    factor = scale * (alpha / rank if alpha else 1.0)
    ref = reference_logits(CFG, merged(stored, mats, factor), TOKENS)
    base = reference_logits(CFG, stored, TOKENS)
    ours = engine.forward(engine.new_sequence(), TOKENS, all_logits=True, lora=engine.lora_set({"a": scale}))
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    moved = np.abs(ref - base).max() / np.abs(ref).max()
    print(f"rank {rank} {dtype}: max |ours - ref| / max |ref| = {err:.2e}; the adapter moved the logits {moved:.2e}")
    assert err < 2e-3 and moved > 50 * err


def test_two_adapters_at_once(tmp_path, tiny):
    engine, stored = tiny
    p1, m1 = adapter_file(tmp_path, "one", 4, ALL, seed=1, alpha=4.0)
    p2, m2 = adapter_file(tmp_path, "two", 8, ATTN, seed=2)
    engine.load_lora("one", p1)
    engine.load_lora("two", p2)
    ref = reference_logits(CFG, merged(merged(stored, m1, 0.5), m2, -0.7), TOKENS)
    ours = engine.forward(engine.new_sequence(), TOKENS, all_logits=True,
                          lora=engine.lora_set({"two": -0.7, "one": 0.5}))
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 2e-3


def run_alone(engine, lora, chunks=(len(TOKENS),)):
    seq, out, at = engine.new_sequence(), [], 0
    for n in chunks:
        out.append(engine.forward(seq, TOKENS[at:at + n], all_logits=True, lora=lora))
        at += n
    return np.concatenate(out)


def test_mixed_batch_threads_and_chunks_bit_identical(tmp_path, tiny):
    engine, _ = tiny
    engine.load_lora("one", adapter_file(tmp_path, "one", 4, ALL, seed=1)[0])
    engine.load_lora("two", adapter_file(tmp_path, "two", 16, ATTN + ("ffn_down",), seed=2, dtype="F16")[0])
    sets = [LoraSet(), engine.lora_set({"one": 1.0}), engine.lora_set({"one": 0.5, "two": 2.0})]
    alone = [run_alone(engine, s) for s in sets]
    assert not np.array_equal(alone[0], alone[1]) and not np.array_equal(alone[1], alone[2])
    # One native step holding all three, each in a different chunking.
    seqs = [engine.new_sequence() for _ in sets]
    outs = [np.empty((len(TOKENS), engine.config.n_vocab), np.float32) for _ in sets]
    engine._core.forward([(q, np.asarray(TOKENS, np.int32), o, True, None, s.native())
                          for q, o, s in zip(seqs, outs, sets)])
    for a, b in zip(alone, outs):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    for s, a in zip(sets, alone):
        assert np.array_equal(run_alone(engine, s, (1, 6, 13)), a)
    one = Engine(engine.path, threads=1)
    try:
        one.load_lora("one", engine.adapters["one"].path)
        one.load_lora("two", engine.adapters["two"].path)
        assert np.array_equal(run_alone(one, one.lora_set({"one": 1.0})), alone[1])
        assert np.array_equal(run_alone(one, one.lora_set({"one": 0.5, "two": 2.0})), alone[2])
    finally:
        one.close()


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16", ("Q8_0", "F16")], ids=str)
def test_every_simd_path_bit_identical(tmp_path, tiny, dtype):
    engine, _ = tiny
    engine.load_lora("one", adapter_file(tmp_path, "one", 5, ALL, dtype=dtype)[0])
    lora = engine.lora_set({"one": 1.0})
    before = _core.active_isa()
    try:
        outs = {}
        for isa in PATHS[: PATHS.index(_core.detect_isa()) + 1]:
            _core.set_isa(isa)
            outs[isa] = run_alone(engine, lora)
    finally:
        _core.set_isa(before)
    first = next(iter(outs.values()))
    for isa, out in outs.items():
        assert np.array_equal(out, first), isa


@pytest.mark.parametrize("dtype,rank", [("F16", 16), ("BF16", 16), (("BF16", "F16"), 16), (("F16", "BF16"), 8),
                                        (("Q8_0", "F16"), 16), (("Q8_0", "BF16"), 7), ("Q8_0", 32)], ids=str)
def test_adapter_kept_as_is_computes_as_its_f32_values(tmp_path, tiny, dtype, rank):
    """An F16, BF16 or Q8_0 matrix is kept as the file holds it (half or a quarter of
    the bytes; A and B each in its own type); each value widens exactly, so the logits
    are those of an F32 file holding the same values, bit for bit. (A Q8_0 B, whose rows
    are the rank, is widened to F32 at load: lora::up has no Q8_0 form.)"""
    engine, _ = tiny
    kept, stored = adapter_file(tmp_path, "kept", rank, ALL, seed=3, dtype=dtype)
    write_lora(tmp_path / "full.gguf", CFG.arch, stored, dtype="F32")
    engine.load_lora("kept", kept)
    engine.load_lora("full", tmp_path / "full.gguf")
    got = run_alone(engine, engine.lora_set({"kept": 0.5}), (7, 1, 12))
    assert np.array_equal(got.view(np.uint32), run_alone(engine, engine.lora_set({"full": 0.5})).view(np.uint32))
    assert engine.adapters["kept"].core.n_bytes < engine.adapters["full"].core.n_bytes * (0.6 if dtype != "Q8_0" else 1)


def test_identity_is_canonical(tmp_path, tiny):
    engine, _ = tiny
    engine.load_lora("one", adapter_file(tmp_path, "one", 4, seed=1)[0])
    engine.load_lora("two", adapter_file(tmp_path, "two", 4, seed=2)[0])
    a = engine.lora_set({"one": 0.5, "two": 1.0})
    b = engine.lora_set({"two": 1.0, "one": 0.5})
    assert a == b and a.identity == b.identity and len(a.identity[0][0]) == 64
    assert engine.lora_set({"one": 0.5}) != engine.lora_set({"one": 0.25})
    assert not engine.lora_set({"one": 0.0})  # a zero scale is no adapter


def refuse(engine, path, match):
    before = dict(engine.adapters)
    with pytest.raises(ModelFileError, match=match):
        engine.load_lora("bad", path)
    assert engine.adapters == before


def test_refusals(tmp_path, tiny):
    engine, _ = tiny
    good, mats = adapter_file(tmp_path, "good", 4)
    wide = TinyConfig(n_embd=96)
    other = random_lora(shapes(wide), 1, 4, ("attn_q",))
    write_lora(tmp_path / "wide.gguf", CFG.arch, other)
    refuse(engine, tmp_path / "wide.gguf", r"not made for this model: blk\.0\.attn_q: lora_a must be \[64, rank\]")
    write_lora(tmp_path / "qwen.gguf", "qwen2", mats)
    refuse(engine, tmp_path / "qwen.gguf", "an adapter for architecture 'qwen2', and this model is 'llama'")
    deep = random_lora(shapes(CFG), CFG.n_layer + 1, 4, ("attn_q",))
    write_lora(tmp_path / "deep.gguf", CFG.arch, deep)
    refuse(engine, tmp_path / "deep.gguf", "blk.2.attn_q: the model has 2 layers")
    data = good.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 100])
    refuse(engine, tmp_path / "cut.gguf", "truncated|beyond|past the end|extends")
    zero = {"blk.0.attn_q": (np.zeros((0, 64), np.float32), np.zeros((64, 0), np.float32))}
    write_lora(tmp_path / "zero.gguf", CFG.arch, zero)
    refuse(engine, tmp_path / "zero.gguf", r"lora_a' has an empty dimension: shape \(64, 0\)")
    nan = {"blk.0.attn_q": (np.full((4, 64), np.nan, np.float32), np.ones((64, 4), np.float32))}
    write_lora(tmp_path / "nan.gguf", CFG.arch, nan)
    refuse(engine, tmp_path / "nan.gguf", "not finite")
    inf = {"blk.0.attn_q": (np.ones((4, 64), np.float32), np.full((64, 4), -np.inf, np.float32))}
    write_lora(tmp_path / "inf.gguf", CFG.arch, inf, dtype="BF16")  # checked on its bits
    refuse(engine, tmp_path / "inf.gguf", "not finite")
    write_lora(tmp_path / "huge.gguf", CFG.arch, mats, alpha=np.float64(1e300))  # finite, not in float32
    refuse(engine, tmp_path / "huge.gguf", r"adapter.lora.alpha is 1e\+300, not a finite number in float32")
    write_gguf(tmp_path / "model.gguf", CFG, make_weights(CFG))
    refuse(engine, tmp_path / "model.gguf", "not a LoRA adapter")
    engine.load_lora("good", good)
    for scale in (math.nan, math.inf, "x"):
        with pytest.raises(ValueError, match="must be a"):
            engine.lora_set({"good": scale})
    with pytest.raises(ValueError, match="unknown LoRA adapter 'nope' \\(loaded: good\\)"):
        engine.lora_set({"nope": 1.0})
    with pytest.raises(CtxError, match="already taken"):
        engine.load_lora("good", good)


def test_bad_names_scales_and_sets_refused(tmp_path, tiny):
    engine, _ = tiny
    good, mats = adapter_file(tmp_path, "good", 4)
    pair = mats["blk.0.attn_q"]
    for name in ("blk.00.attn_q", "blk.2147483648.attn_q", "blk.1e3.attn_q"):  # llama.cpp matches none of these
        write_lora(tmp_path / "odd.gguf", CFG.arch, {name: pair})
        refuse(engine, tmp_path / "odd.gguf", "is not a LoRA matrix this engine applies")
    write_lora(tmp_path / "huge.gguf", CFG.arch, {"blk.999999999.attn_q": pair})
    refuse(engine, tmp_path / "huge.gguf", "blk.999999999.attn_q: the model has 2 layers")
    engine.load_lora("good", good)
    for scale in (True, "0.5", 10**400, 1e39, -1e39, None):
        with pytest.raises(ValueError, match=r"must be a (finite )?number"):
            engine.lora_set({"good": scale})
    assert engine.lora_set({"good": np.float32(0.5)}).identity[0][1] == 0.5
    with pytest.raises(ValueError, match="given as {name: scale}"):
        engine.lora_set("good")
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(good.read_bytes())
    engine.load_lora("copy", copy)
    with pytest.raises(ValueError, match="'copy' and 'good' are the same file|'good' and 'copy' are the same file"):
        engine.lora_set({"good": 1.0, "copy": 1.0})
    # the same bytes are the same adapter, whatever name a set was built from
    assert engine.lora_set({"copy": 0.5}) == engine.lora_set({"good": 0.5})
    assert len({engine.lora_set({"copy": 0.5}), engine.lora_set({"good": 0.5})}) == 1


def test_scales_that_overflow_are_refused_and_nan_logits_name_the_adapters(tmp_path, tiny):
    # An alpha of 1e30 loaded, and every forward under it was NaN: logprobs returned NaN
    # and a generation failed only in the sampler, with no word of the adapter.
    from ctxengine.engine.lora import check_finite
    engine, _ = tiny
    path = adapter_file(tmp_path, "loud", 4, alpha=1e30)[0]
    engine.load_lora("loud", path)
    with pytest.raises(ValueError, match=r"scale 1e\+10 of LoRA adapter 'loud' times its alpha 1e\+30 overflows"):
        engine.lora_set({"loud": 1e10})
    loud = engine.lora_set({"loud": 1.0})  # 1e30 / 4 is finite: the overflow comes in the forward
    with pytest.raises(CtxError, match=r"not finite under LoRA loud \(.*\) x 1\.0: .* use smaller ones"):
        engine.logprobs(TOKENS, lora=loud)
    with pytest.raises(CtxError, match="not finite under LoRA loud"):
        check_finite(engine.forward(engine.new_sequence(), TOKENS, lora=loud), loud)
    logits = np.zeros(8, np.float32)
    logits[3] = -np.inf
    check_finite(logits, loud)  # a masked token is not an overflow
    assert np.isfinite(engine.logprobs(TOKENS).next_logprobs).all()


def test_adapter_of_another_engine_refused(tmp_path, tiny):
    engine, _ = tiny
    path = adapter_file(tmp_path, "one", 4)[0]
    other = Engine(engine.path, threads=1)
    try:
        foreign = other.load_lora("one", path)
        with pytest.raises(ValueError, match="loaded for another model"):
            engine.forward(engine.new_sequence(), TOKENS, lora=LoraSet(((foreign, 1.0),)))
    finally:
        other.close()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("rank", [1, 3, 8, 16, 17, 40])
def test_lora_up_kernel_every_path_bit_identical(rank, dtype):
    """lora_up (lora_up_f16, lora_up_bf16 for 16-bit B) on each SIMD path against the scalar
    one, bit for bit, and against matmul_f's canonical order (B t) then a float32 multiply and add."""
    rng = np.random.default_rng(rank)
    n_out, n_x = 37, 3
    bt = rng.standard_normal((rank, n_out)).astype(np.float32)
    if dtype == "f16":
        bt = bt.astype(np.float16)
    elif dtype == "bf16":  # the high halves: bf16 bits (truncated, as good as rounded here)
        bt = (bt.view(np.uint32) >> 16).astype(np.uint16)
    t = rng.standard_normal((n_x, rank)).astype(np.float32)
    y0 = rng.standard_normal((n_x, n_out)).astype(np.float32)
    wtype = {"f32": 0, "f16": 1, "bf16": 30}[dtype]  # GGML F32 / F16 / BF16 weights: B's rows
    d = _core.quant.matmul(wtype, np.ascontiguousarray(bt.T).view(np.uint8), rank, n_out, t)
    want = y0.copy()
    want[:, 5:33] = y0[:, 5:33] + np.float32(0.75) * d[:, 5:33]
    before = _core.active_isa()
    try:
        for isa in PATHS[: PATHS.index(_core.detect_isa()) + 1]:
            _core.set_isa(isa)
            got = _core.lora_up(bt, t, 0.75, y0.copy(), 5, 33, bf16=dtype == "bf16")
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), isa
    finally:
        _core.set_isa(before)


def test_q8_0_matmul_f_every_path_is_the_f32_product_of_its_values():
    """matmul_f on Q8_0 rows (a LoRA A kept as the file holds it): each weight widened
    exactly, then the float order, so every path gives the bits of the F32 matmul of the
    dequantized values, for any row range, chunking and number of activation rows."""
    Q, G = _core.quant, gguf.GGMLQuantizationType
    rng = np.random.default_rng(20261203)
    before = _core.active_isa()
    try:
        for n_in, n_out in ((32, 5), (96, 16), (576, 17)):
            w = rng.standard_normal((n_out, n_in)).astype(np.float32) * np.exp(rng.uniform(-6, 6, (n_out, 1)))
            w[0, :32] = 0.0  # an all-zero block (d = 0)
            raw = gguf.quants.quantize(w, G.Q8_0)
            values = np.asarray(gguf.quants.dequantize(raw, G.Q8_0), dtype=np.float32).reshape(n_out, n_in)
            for n_x in (1, 2, 3, 5, 9):
                x = rng.standard_normal((n_x, n_in)).astype(np.float32)
                for isa in PATHS[: PATHS.index(_core.detect_isa()) + 1]:
                    _core.set_isa(isa)
                    for o0, o1, chunk in ((0, n_out, 0), (1, n_out, 3), (2, n_out - 1, 4)):
                        got = Q.matmul(int(G.Q8_0), raw.reshape(-1), n_in, n_out, x, o0, o1, chunk, float_x=True)
                        want = Q.matmul(int(G.F32), values.view(np.uint8).reshape(-1), n_in, n_out, x, o0, o1, chunk)
                        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (isa, n_in, n_x, o0, chunk)
    finally:
        _core.set_isa(before)
    with pytest.raises(ValueError, match="float_x"):
        Q.matmul(int(G.Q4_0), np.zeros(18, np.uint8), 32, 1, np.zeros((1, 32), np.float32), float_x=True)
