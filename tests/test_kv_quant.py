"""Quantized KV pages (issue 6): q8 (K and V 8-bit) and vq8 (V 8-bit, K f16).

* the kernels: every SIMD path bit-identical to scalar on the q8 layouts, the
  same order as the f16 kernels, close to a float64 reference;
* the page layout: bytes per dtype, tails (values and scales) zeroed;
* tiny synthetic models against a numpy transformer that rounds K and V the
  same way;
* SmolLM2: teacher-forced top-1 agreement with llama.cpp's reference, the
  determinism rules (threads, batches, chunks, SIMD paths, identical pages),
  snapshots that record the dtype, restore bit-identically and refuse
  another dtype.
"""
import numpy as np
import pytest

import ctxengine as ce
from ctxengine import _core
from ctxengine.cli.common import KV_DTYPES as CLI_KV_DTYPES
from ctxengine.engine.engine import KV_DTYPES, Engine
from ctxengine.errors import StoreError, UnsupportedModelError
from ctxengine.store import Store
from simd_paths import AVAILABLE, EVERY_PATH
from tiny_models import TinyConfig, kv8_quantize, make_weights, reference_logits, write_gguf

LOWER_PATHS = AVAILABLE[:-1]
QUANTIZED = ("q8", "vq8")
PROMPT = ("The quick brown fox jumps over the lazy dog. Snapshots keep a context alive across "
          "processes and machines, and a restored context goes on exactly where it had stopped.")
SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95)


@pytest.fixture(autouse=True)
def restore_isa():
    before = _core.active_isa()
    yield
    _core.set_isa(before)


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def on_each_path(fn) -> dict:
    out = {}
    for path in AVAILABLE:
        _core.set_isa(path)
        out[path] = fn()
    return out


def assert_same_bits(results: dict):
    ref = results["scalar"]
    for path, got in results.items():
        differ = bits(got) != bits(ref)
        if differ.any():
            i = int(np.argmax(differ))
            pytest.fail(f"{path} differs from scalar at {i}: {got.flat[i]!r} vs {ref.flat[i]!r} "
                        f"({int(differ.sum())} of {differ.size})")


def random_k(rng, hd, stride, scales=None):
    """A head's q8 K block: int8 (hd, stride), f16 scales (hd / 32, stride)."""
    kq = rng.integers(-128, 128, (hd, stride), dtype=np.int8)  # -128 too, which the quantizer never makes
    ks = (rng.random((hd // 32, stride)) * 0.05).astype(np.float16) if scales is None else scales
    return kq, ks


def dequant_k(kq, ks):
    return kq.astype(np.float64) * np.repeat(ks.astype(np.float64), 32, axis=0)


# -- kernels ---------------------------------------------------------------------

@pytest.mark.parametrize("hd,stride,n", [(64, 16, 16), (64, 16, 5), (32, 16, 1), (256, 16, 13), (96, 16, 16),
                                         (32, 32, 31), (64, 40, 37)])
def test_q8_scores_paths_bit_identical(hd, stride, n):
    rng = np.random.default_rng(hd * 100 + n)
    q = rng.standard_normal(hd).astype(np.float32)
    kq, ks = random_k(rng, hd, stride)
    got = on_each_path(lambda: _core.attn_scores_q8(q, kq, ks.view(np.uint16), n, 0.125))
    assert_same_bits(got)
    exact = (dequant_k(kq, ks)[:, :n].T @ q.astype(np.float64)) * 0.125
    np.testing.assert_allclose(got["scalar"], exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", EVERY_PATH)
def test_q8_scores_follow_the_f16_kernels_order(isa):
    # With power-of-two scales every dequantized value is an f16 as well, so
    # the q8 kernel must give exactly the f16 kernel's bits on those values.
    _core.set_isa(isa)
    rng = np.random.default_rng(3)
    hd, stride = 64, 16
    q = rng.standard_normal(hd).astype(np.float32)
    ks = (2.0 ** rng.integers(-12, -2, (hd // 32, stride))).astype(np.float16)
    kq, _ = random_k(rng, hd, stride, ks)
    as_f16 = dequant_k(kq, ks).astype(np.float16)
    for n in (16, 7):
        assert np.array_equal(bits(_core.attn_scores_q8(q, kq, ks.view(np.uint16), n, 0.125)),
                              bits(_core.attn_scores(q, as_f16.view(np.uint16), n, 0.125)))


@pytest.mark.parametrize("n,hd", [(1, 64), (16, 64), (13, 256), (40, 96), (7, 32), (16, 128)])
def test_q8_weighted_sum_paths_bit_identical(n, hd):
    rng = np.random.default_rng(n * 1000 + hd)
    scores = (3 * rng.standard_normal(n)).astype(np.float32)
    vq = rng.integers(-128, 128, (n, hd), dtype=np.int8)
    vs = (rng.random((n, hd // 32)) * 0.05).astype(np.float16)
    out = rng.standard_normal(hd).astype(np.float32)
    got = on_each_path(lambda: _core.attn_softmax_v_q8(scores, vq, vs.view(np.uint16), out))
    assert all(mx == scores.max() for _, mx in got.values())
    assert_same_bits({path: res for path, (res, _) in got.items()})
    w = np.exp(scores.astype(np.float64) - scores.max())
    v = vq.astype(np.float64) * np.repeat(vs.astype(np.float64), 32, axis=1)
    np.testing.assert_allclose(got["scalar"][0], (w / w.sum()) @ v, rtol=2e-3, atol=2e-3)  # out only gives the size


@pytest.mark.parametrize("isa", EVERY_PATH)
def test_q8_weighted_sum_follows_the_f16_kernels_order(isa):
    _core.set_isa(isa)
    rng = np.random.default_rng(5)
    n, hd = 13, 64
    scores = (3 * rng.standard_normal(n)).astype(np.float32)
    vq = rng.integers(-128, 128, (n, hd), dtype=np.int8)
    vs = (2.0 ** rng.integers(-12, -2, (n, hd // 32))).astype(np.float16)
    as_f16 = (vq.astype(np.float64) * np.repeat(vs.astype(np.float64), 32, axis=1)).astype(np.float16)
    out = rng.standard_normal(hd).astype(np.float32)
    a, _ = _core.attn_softmax_v_q8(scores, vq, vs.view(np.uint16), out)
    b, _ = _core.attn_softmax_v(scores, as_f16.view(np.uint16), out)
    assert np.array_equal(bits(a), bits(b))


def test_quantize_kv8_matches_the_documented_rule():
    rng = np.random.default_rng(11)
    rows = [rng.standard_normal(192).astype(np.float32) * s for s in (1e-3, 1, 40)]
    # A zero block, an all-negative block, and exact halves (amax 127 makes 127 / amax == 1).
    special = np.zeros(96, np.float32)
    special[32:64] = -np.arange(1, 33, dtype=np.float32)
    special[64:96] = [127, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.5] + [0] * 24
    for x in rows + [special]:
        q, d = _core.quant.quantize_kv8(x)
        ref_q, ref_d = kv8_quantize(x)
        assert np.array_equal(q, ref_q) and np.array_equal(d, ref_d.view(np.uint16))
    q, d = _core.quant.quantize_kv8(special)
    assert not q[:32].any() and d[0] == 0
    assert list(q[64:72]) == [127, 2, -2, 4, -4, 0, 0, 2]  # round half to even
    with pytest.raises(ValueError):
        _core.quant.quantize_kv8(np.zeros(20, np.float32))


# -- page layout -----------------------------------------------------------------

def split_page(raw: bytes, n_layer: int, pt: int, kv_dim: int, dtype: str) -> list[dict]:
    """Per layer {k, ks, v, vs}: views of a page's bytes in the layout of
    native/kv/page_pool.h (K arrays are [row][slot], V arrays [slot][row])."""
    buf = np.frombuffer(raw, np.uint8)
    nb, off, layers = kv_dim // 32, 0, []

    def take(dt, shape):
        nonlocal off
        size = int(np.prod(shape)) * np.dtype(dt).itemsize
        a = buf[off:off + size].view(dt).reshape(shape)
        off += size
        return a

    for _ in range(n_layer):
        layer = {"k": take(np.int8 if dtype == "q8" else np.float16, (kv_dim, pt))}
        if dtype == "q8":
            layer["ks"] = take(np.float16, (nb, pt))
        layer["v"] = take(np.int8 if dtype != "f16" else np.float16, (pt, kv_dim))
        if dtype != "f16":
            layer["vs"] = take(np.float16, (pt, nb))
        layers.append(layer)
    assert off == len(buf), "the layout accounts for every byte"
    return layers


def expected_page_bytes(n_layer, pt, kv_dim, dtype):
    k = pt * kv_dim * (1 if dtype == "q8" else 2) + (pt * kv_dim // 32 * 2 if dtype == "q8" else 0)
    v = pt * kv_dim * (1 if dtype != "f16" else 2) + (pt * kv_dim // 32 * 2 if dtype != "f16" else 0)
    return n_layer * (k + v)


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_page_bytes_follow_the_dtype(dtype):
    pool = _core.PagePool(n_layer=3, page_tokens=4, kv_dim=64, kv_dtype=dtype, max_pages=8)
    assert pool.kv_dtype == dtype
    assert pool.page_bytes == expected_page_bytes(3, 4, 64, dtype)
    split_page(bytes(pool.page_bytes), 3, 4, 64, dtype)


def test_bad_kv_dtypes_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        _core.PagePool(n_layer=1, page_tokens=4, kv_dim=48, kv_dtype="q8", max_pages=8)
    with pytest.raises(ValueError, match="unknown KV dtype 'q4'"):
        _core.PagePool(n_layer=1, page_tokens=4, kv_dim=64, kv_dtype="q4", max_pages=8)
    assert CLI_KV_DTYPES == KV_DTYPES  # the CLI's copy (it must not import the native core to parse arguments)


@pytest.mark.parametrize("dtype", QUANTIZED)
@pytest.mark.parametrize("used", [1, 3])
def test_truncate_zeroes_values_and_scales(dtype, used):
    pt, kv_dim = 4, 64
    pool = _core.PagePool(n_layer=2, page_tokens=pt, kv_dim=kv_dim, kv_dtype=dtype, max_pages=8)
    seq = _core.KVSeq(pool)
    page = pool.import_page(bytes([0x11]) * pool.page_bytes)
    seq.append_page(page, pt)
    pool.release(page)
    seq.truncate(used)
    for layer in split_page(seq.export_page(0), 2, pt, kv_dim, dtype):
        for name, a in layer.items():
            slots = a[:, used:] if name in ("k", "ks") else a[used:]
            kept = a[:, :used] if name in ("k", "ks") else a[:used]
            assert not slots.view(np.uint8).any(), f"{name} past the end is zero"
            assert (kept.view(np.uint8) == 0x11).all(), f"{name} before the end is kept"


# -- tiny synthetic models -------------------------------------------------------

TOKENS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67, 1, 2, 3, 200]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("kv", QUANTIZED)
def test_tiny_model_with_quantized_kv_matches_reference(tmp_path, arch, kv):
    cfg = TinyConfig(arch=arch, head_dim=32, n_ctx=64)
    stored = write_gguf(tmp_path / "tiny.gguf", cfg, make_weights(cfg))
    m = Engine(tmp_path / "tiny.gguf", threads=2, kv=kv)
    try:
        assert m.pool.kv_dtype == kv
        tokens = TOKENS * 2  # 40 positions: two full pages and a partial one
        ours = m.forward(m.new_sequence(), tokens, all_logits=True)
    finally:
        m.close()
    ref = reference_logits(cfg, stored, tokens, kv=kv)
    f16 = reference_logits(cfg, stored, tokens)
    scale = np.abs(ref).max()
    err, vs_f16 = np.abs(ours - ref).max() / scale, np.abs(ours - f16).max() / scale
    print(f"{arch} {kv}: max |ours - ref({kv})| / max |ref| = {err:.2e}; vs the f16 reference {vs_f16:.2e}")
    assert err < 5e-3
    assert vs_f16 < 0.05
    assert (ours.argmax(axis=1) == f16.argmax(axis=1)).mean() >= 0.9


def test_quantized_kv_needs_a_head_size_multiple_of_32(tmp_path):
    cfg = TinyConfig(head_dim=16)
    write_gguf(tmp_path / "tiny.gguf", cfg, make_weights(cfg))
    with pytest.raises(UnsupportedModelError, match="multiple of 32; this model's is 16"):
        Engine(tmp_path / "tiny.gguf", threads=1, kv="q8")
    with pytest.raises(UnsupportedModelError, match="choose from f16, q8, vq8"):
        Engine(tmp_path / "tiny.gguf", threads=1, kv="q4")


# -- SmolLM2 ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """kv dtype -> SmolLM2 loaded with it (2 threads), loaded on first use."""
    loaded = {}

    def get(kv):
        if kv not in loaded:
            loaded[kv] = ce.load(smollm2_path, threads=2, kv=kv)
        return loaded[kv]

    yield get
    for m in loaded.values():
        m.close()


@pytest.fixture
def q8(smollm2):
    return smollm2("q8")


def all_logits(model, ids):
    return model.engine.forward(model.engine.new_sequence(), ids, all_logits=True)


def pages(seq) -> list[bytes]:
    return [seq.export_page(i) for i in range(len(seq.pages))]


@pytest.mark.parametrize("kv", QUANTIZED)
def test_teacher_forced_top1_agreement_with_llama_cpp(smollm2, smollm2_ref, kv):
    agree = total = 0
    for case in smollm2_ref["teacher"]:
        ours = smollm2(kv).logprobs(case["ids"], top=1)
        for i, ref_ids in enumerate(case["top_ids"]):
            agree += int(ours.top_ids[i, 0] == ref_ids[0])
            total += 1
    rate = agree / total
    print(f"{kv} KV: top-1 agreement with llama.cpp (f16 KV) {rate:.4f} ({agree} of {total} positions)")
    assert rate >= 0.95, f"{kv}: top-1 agreement {rate:.4f} < 0.95"


def test_q8_pages_hold_about_twice_the_tokens_of_f16(smollm2_path):
    budget = 64 << 20
    f16 = Engine(smollm2_path, threads=1, kv_budget=budget)
    q8 = Engine(smollm2_path, threads=1, kv="q8", kv_budget=budget)
    vq8 = Engine(smollm2_path, threads=1, kv="vq8", kv_budget=budget)
    try:
        cfg = f16.config
        for m in (f16, q8, vq8):
            assert m.pool.page_bytes == expected_page_bytes(cfg.n_layer, 16, cfg.kv_dim, m.kv_dtype)
        assert f16.pool.page_bytes == 368640  # DESIGN.md: ~23 KB a token, 368 KB a page
        ratio = q8.pool.max_pages / f16.pool.max_pages
        print(f"pages in {budget >> 20} MiB: f16 {f16.pool.max_pages}, q8 {q8.pool.max_pages} ({ratio:.2f}x), "
              f"vq8 {vq8.pool.max_pages}")
        assert 1.85 < ratio < 1.95
    finally:
        for m in (f16, q8, vq8):
            m.close()


@pytest.mark.parametrize("kv", QUANTIZED)
def test_quantized_kv_is_deterministic_across_threads_batches_and_chunks(smollm2, smollm2_path, smollm2_ref, kv):
    eng = smollm2(kv).engine
    ids = smollm2_ref["teacher"][1]["ids"][:45]
    whole = eng.new_sequence()
    ref = eng.forward(whole, ids, all_logits=True)

    one = Engine(smollm2_path, threads=1, kv=kv)
    try:
        assert np.array_equal(bits(one.forward(one.new_sequence(), ids, all_logits=True)), bits(ref))
    finally:
        one.close()

    single = eng.new_sequence()
    assert np.array_equal(bits(np.stack([eng.forward(single, [t]) for t in ids])), bits(ref))

    chunked, rows, start = eng.new_sequence(), [], 0
    for size in (1, 7, 3, 16, 2, 11, 5):
        rows.append(eng.forward(chunked, ids[start:start + size], all_logits=True))
        start += size
    assert np.array_equal(bits(np.concatenate(rows)), bits(ref))

    # In one step with sequences of other lengths.
    others = [smollm2_ref["teacher"][0]["ids"][: 3 + 5 * k] for k in range(4)]
    items = []
    for toks in [ids] + others:
        buf = np.empty((len(toks), eng.config.n_vocab), np.float32)
        items.append((eng.new_sequence(), np.asarray(toks, np.int32), buf, True, None))
    eng._core.forward(items)
    assert np.array_equal(bits(items[0][2]), bits(ref))

    # Identical prefixes give identical page bytes, and the tail of the last page is zero.
    assert pages(single) == pages(whole) == pages(chunked) == pages(items[0][0])
    cfg = eng.config
    used = len(ids) % 16
    for layer in split_page(pages(whole)[-1], cfg.n_layer, 16, cfg.kv_dim, kv):
        assert not layer["k"][:, used:].any() and not layer["v"][used:].any()
        assert not layer["vs"][used:].any() and layer["vs"][:used].all()
        if kv == "q8":
            assert not layer["ks"][:, used:].any() and layer["ks"][:, :used].all()


@pytest.mark.parametrize("isa", LOWER_PATHS)
@pytest.mark.parametrize("kv", QUANTIZED)
def test_every_simd_path_gives_the_same_logits(smollm2, kv, isa):
    m = smollm2(kv)
    ids = m.tokenize("Determinism is a design rule, also for an 8-bit KV cache.")
    best = all_logits(m, ids)
    _core.set_isa(isa)
    assert np.array_equal(bits(all_logits(m, ids)), bits(best))


def test_q8_snapshot_restores_into_a_fresh_model_bit_identically(q8, smollm2_path, tmp_path):
    orig = q8.context("orig")
    orig.append(PROMPT)
    assert orig.n_tokens % 16 != 0, "the last page is a partial one"
    with Store(tmp_path / "store") as store:
        sid = orig.snapshot(store, ref="q8ctx")
        m = store.get_manifest(sid)
        assert m.kv_dtype == "q8" and m.page_size == q8.engine.pool.page_bytes

        fresh = ce.load(smollm2_path, threads=1, kv="q8")
        try:
            back = fresh.restore(store, "q8ctx")
            assert back.tokens == orig.tokens
            assert pages(back._seq) == pages(orig._seq)
            assert np.array_equal(bits(back._sync()), bits(orig._sync()))
            a = [p.token_id for p in orig.generate(8, seed=5, **SAMPLING)]
            b = [p.token_id for p in back.generate(8, seed=5, **SAMPLING)]
            assert a == b
            assert np.array_equal(bits(back._sync()), bits(orig._sync()))
        finally:
            fresh.close()
    orig.delete()


def test_restore_into_another_kv_dtype_is_refused(q8, smollm2_path, tmp_path):
    with Store(tmp_path / "store") as store:
        c = q8.context(None)
        c.append("A context with an 8-bit KV.")
        sid = c.snapshot(store, ref="q8ctx")
        c.delete()
        f16 = ce.load(smollm2_path, threads=1)
        try:
            with pytest.raises(StoreError) as err:
                f16.restore(store, "q8ctx")
            msg = str(err.value)
            assert sid[:16] in msg and "holds its KV in q8" in msg and "loaded with kv='f16'" in msg
            assert "kv='q8'" in msg and "--kv q8" in msg
            assert f16.contexts.names() == []

            # And the other way round.
            c = f16.context(None)
            c.append("A context with an f16 KV.")
            c.snapshot(store, ref="f16ctx")
            c.delete()
        finally:
            f16.close()
        with pytest.raises(StoreError, match="holds its KV in f16, but the model is loaded with kv='q8'; load the model with kv='f16'"):
            q8.restore(store, "f16ctx")
