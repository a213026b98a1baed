"""Attention biases, each optional where llama.cpp has it optional, and the files llama.cpp
refuses, refused here too, with a message that names what (and says what llama.cpp does
only where that is so).

llama.cpp 0.3.36: create_tensor_qkv makes attn_q/k/v.bias (or the fused attn_qkv.bias)
TENSOR_NOT_REQUIRED for llama, qwen2, qwen3, gemma3 and phi3, and build_qkv adds each one
present; only llama's loader has attn_output.bias (wo_b, added after wo in build_attn);
only llama's has rope_freqs.weight; llama refuses rope.dimension_count != head size
("invalid n_rot") and the qwen2 / qwen3 graphs assert it; phi3 and gemma3 rotate part of a head.
"""
import numpy as np
import pytest

from ctxengine.engine.engine import Engine
from ctxengine.errors import ModelFileError, UnsupportedModelError
from llamacpp import is_avx512_build
from tiny_models import TinyConfig, make_weights, reference_logits, write_gguf

TOKENS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67, 1, 2, 3, 200]
F32_TOL = 2e-3  # tests/test_architectures.py's for F32: relative to the largest logit
LIVE_TOL = 1e-4  # ours vs llama.cpp, F32: the same float32 sums (the probe saw 0 on the real shapes)
# Against an AVX2-only build of llama.cpp (tests/llamacpp.py, AVX2_BUILD_DIFFERS): its exp and its
# attention sums round otherwise; on a Zen 3 these few-layer F32 models differed by up to 9.3e-4.
LIVE_TOL_AVX2_BUILD = 5e-3


class Biased:
    """A weight whose product with h is h @ W^T + b, for tiny_models.reference_logits (which
    computes ``h @ f(W).T``): numpy defers ``h @ self`` to __rmatmul__ (__array_ufunc__ = None),
    so the float64 reference adds each bias right after its matmul, as llama.cpp does."""
    __array_ufunc__ = None

    def __init__(self, w, b):
        self.w, self.b = np.asarray(w, np.float64), np.asarray(b, np.float64)

    def astype(self, _):
        return self

    @property
    def T(self):  # noqa: N802 (numpy's name)
        return self

    def __rmatmul__(self, h):
        return np.asarray(h, np.float64) @ self.w.T + self.b


def add_biases(cfg: TinyConfig, w: dict, names: tuple[str, ...], seed: int = 3) -> None:
    """Random biases `names` (attn_q.bias, ..., attn_qkv.bias) in every block of w."""
    rng = np.random.default_rng(seed)
    qd, kd = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    size = {"attn_q.bias": qd, "attn_k.bias": kd, "attn_v.bias": kd, "attn_output.bias": cfg.n_embd,
            "attn_qkv.bias": qd + 2 * kd}
    for i in range(cfg.n_layer):
        for name in names:
            w[f"blk.{i}.{name}"] = (0.5 * rng.standard_normal(size[name])).astype(np.float32)


def drop(w: dict, *names: str) -> None:
    for key in [k for k in w if k.split(".", 2)[-1] in names]:
        del w[key]


def for_reference(cfg: TinyConfig, stored: dict) -> dict:
    """The file's weights with each bias folded into its matmul (Biased), but qwen2's q/k/v ones,
    which the reference adds (zeros for those the file lacks); a fused attn_qkv and its bias
    split into q, k and v first."""
    w = dict(stored)
    qd, kd = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in w:
            parts = np.split(w.pop(p + "attn_qkv.weight"), [qd, qd + kd])
            biases = np.split(w.pop(p + "attn_qkv.bias"), [qd, qd + kd]) if p + "attn_qkv.bias" in w else None
            for x, part, b in zip("qkv", parts, biases or (None,) * 3):
                w[p + f"attn_{x}.weight"] = part
                if b is not None:
                    w[p + f"attn_{x}.bias"] = b
        if cfg.arch == "qwen2":  # the reference adds qwen2's three itself: a missing one adds zeros
            for x, n in (("q", qd), ("k", kd), ("v", kd)):
                w.setdefault(p + f"attn_{x}.bias", np.zeros(n, np.float32))
        for x in ("output",) if cfg.arch == "qwen2" else ("q", "k", "v", "output"):
            if p + f"attn_{x}.bias" in w:
                w[p + f"attn_{x}.weight"] = Biased(w[p + f"attn_{x}.weight"], w.pop(p + f"attn_{x}.bias"))
    return w


def model(tmp_path, arch: str, add=(), remove=(), extra=None, name=None, **opts) -> tuple[TinyConfig, dict, object]:
    """A tiny `arch` model with the biases `add`, without `remove`, plus the tensors `extra`."""
    cfg = TinyConfig(arch=arch, **opts)
    w = make_weights(cfg)
    add_biases(cfg, w, tuple(add))
    drop(w, *remove)
    w.update(extra or {})
    path = tmp_path / f"{name or arch}.gguf"
    return cfg, write_gguf(path, cfg, w), path


def set_rope_dim(path, arch: str, rope_dim: int) -> None:
    """Rewrite the file's <arch>.rope.dimension_count (a uint32)."""
    data = bytearray(path.read_bytes())
    key = f"{arch}.rope.dimension_count".encode()
    at = data.index(key) + len(key) + 4  # the value's type, then the value
    data[at:at + 4] = rope_dim.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def our_logits(path) -> np.ndarray:
    m = Engine(path, threads=2)
    try:
        return m.forward(m.new_sequence(), TOKENS, all_logits=True)
    finally:
        m.close()


QKV = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
# (arch, biases added, biases removed, TinyConfig options): files llama.cpp runs.
ACCEPTED = [
    ("llama", ("attn_output.bias",), (), {}),
    ("llama", QKV + ("attn_output.bias",), (), dict(tied=False, rope_freqs=True)),
    ("llama", ("attn_q.bias",), (), {}),
    ("llama", ("attn_k.bias", "attn_output.bias"), (), {}),
    ("llama", ("attn_v.bias",), (), {}),
    ("qwen2", (), QKV, {}),
    ("qwen2", (), ("attn_k.bias", "attn_v.bias"), {}),
    ("qwen2", (), ("attn_v.bias",), {}),
    ("qwen3", QKV, (), {}),
    ("qwen3", ("attn_k.bias",), (), {}),
    ("gemma3", ("attn_q.bias", "attn_v.bias"), (), dict(swa_window=5, n_layer=3)),
    ("phi3", ("attn_qkv.bias",), (), dict(tied=False)),
]
IDS = [f"{a}+{'+'.join(x.split('.')[0] for x in add) or '0'}-{'-'.join(x.split('.')[0] for x in rm) or '0'}"
       for a, add, rm, _ in ACCEPTED]


@pytest.mark.parametrize("arch,add,remove,opts", ACCEPTED, ids=IDS)
def test_optional_biases_match_the_numpy_reference(tmp_path, arch, add, remove, opts):
    cfg, stored, path = model(tmp_path, arch, add, remove, **opts)
    ref = reference_logits(cfg, for_reference(cfg, stored), TOKENS)
    ours = our_logits(path)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    print(f"{arch} +{add} -{remove}: max |ours - ref| / max |ref| = {err:.2e}")
    assert err < F32_TOL
    assert (ours.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.9


def test_the_output_bias_is_really_added(tmp_path):
    _, _, plain = model(tmp_path, "llama", name="plain")
    _, _, biased = model(tmp_path, "llama", ("attn_output.bias",))
    assert np.abs(our_logits(plain) - our_logits(biased)).max() > 1e-2


# llama.cpp's phi3 needs a SentencePiece vocabulary (the byte vocabulary fails in its loader),
# so phi3 is compared live by the probe only; the rest here.
LIVE = [c for c in ACCEPTED if c[0] != "phi3"] + [("gemma3", (), (), dict(swa_window=5, n_layer=3, rope_dim=8))]


@pytest.mark.parametrize("arch,add,remove,opts", LIVE, ids=[f"{a}-{i}" for i, (a, *_) in enumerate(LIVE)])
def test_optional_biases_match_llama_cpp_live(tmp_path, llamacpp, arch, add, remove, opts):
    opts = dict(opts)
    rope_dim = opts.pop("rope_dim", None)
    _, _, path = model(tmp_path, arch, add, remove, **opts)
    if rope_dim:  # gemma3 rotating part of each head, as llama.cpp does too
        set_rope_dim(path, arch, rope_dim)
    theirs = llamacpp.run(path, [{"kind": "logits", "ids": TOKENS}])[0]["logits"]
    diff = np.abs(our_logits(path) - theirs).max()
    print(f"{arch} +{add} -{remove}: max |ours - llama.cpp| = {diff:.3g}")
    assert diff <= (LIVE_TOL if is_avx512_build(llamacpp) else LIVE_TOL_AVX2_BUILD)


def refused(tmp_path, arch, add=(), extra=None, rope_dim=None, **opts):
    _, _, path = model(tmp_path, arch, add, extra=extra, **opts)
    if rope_dim:
        set_rope_dim(path, arch, rope_dim)
    return path


@pytest.mark.parametrize("arch,why", [
    ("llama", "llama.cpp refuses it too: invalid n_rot"),
    ("qwen2", r"llama.cpp aborts on it: GGML_ASSERT\(n_embd_head == n_rot\)"),
    ("qwen3", r"llama.cpp aborts on it: GGML_ASSERT\(n_embd_head == n_rot\)"),
])
def test_partial_rotary_is_refused_where_llama_cpp_refuses_it(tmp_path, arch, why):
    path = refused(tmp_path, arch, rope_dim=8)
    with pytest.raises(ModelFileError, match=rf"{arch}\.rope\.dimension_count is 8, but a {arch} model rotates "
                                             rf"whole heads of 16 dimensions \({why}\)"):
        Engine(path, threads=1)


@pytest.mark.parametrize("arch,opts", [("phi3", dict(tied=False)), ("gemma3", dict(swa_window=5, n_layer=3))])
def test_partial_rotary_still_loads_where_llama_cpp_runs_it(tmp_path, arch, opts):
    path = refused(tmp_path, arch, rope_dim=8, **opts)
    assert np.isfinite(our_logits(path)).all()


@pytest.mark.parametrize("arch,opts", [("qwen2", {}), ("qwen3", {}), ("gemma3", dict(swa_window=5)),
                                       ("phi3", dict(tied=False))])
def test_an_attention_output_bias_is_refused_where_llama_cpp_has_none(tmp_path, arch, opts):
    path = refused(tmp_path, arch, ("attn_output.bias",), **opts)
    with pytest.raises(ModelFileError, match=rf"blk\.0\.attn_output\.bias, blk\.1\.attn_output\.bias are not "
                                             rf"tensors of a {arch} model with 2 blocks \(another architecture, "
                                             r"or a damaged file; llama.cpp refuses it too\)"):
        Engine(path, threads=1)


@pytest.mark.parametrize("arch,opts", [("qwen2", {}), ("qwen3", {}), ("gemma3", dict(swa_window=5)),
                                       ("phi3", dict(tied=False))])
def test_rope_freqs_is_refused_outside_llama(tmp_path, arch, opts):
    path = refused(tmp_path, arch, rope_freqs=True, **opts)
    with pytest.raises(ModelFileError, match=rf"rope_freqs\.weight is not a tensor of a {arch} model .*"
                                             r"llama.cpp refuses it too"):
        Engine(path, threads=1)


def test_tensors_llama_cpp_reads_but_the_engine_does_not_are_unsupported_not_damaged(tmp_path):
    path = refused(tmp_path, "qwen2", extra={"output.bias": np.zeros(259, np.float32)})
    with pytest.raises(UnsupportedModelError, match=r"llama.cpp reads output\.bias in a qwen2 model, but the "
                                                    r"engine does not support it yet"):
        Engine(path, threads=1)
    path = refused(tmp_path, "llama", extra={"blk.1.ffn_down.bias": np.zeros(64, np.float32)})
    with pytest.raises(UnsupportedModelError, match=r"llama.cpp reads blk\.1\.ffn_down\.bias in a llama model"):
        Engine(path, threads=1)
    path = refused(tmp_path, "llama", extra={"output.bias": np.zeros(259, np.float32)})  # llama.cpp: no
    with pytest.raises(ModelFileError, match=r"output\.bias is not a tensor .* llama.cpp refuses it too"):
        Engine(path, threads=1)


def test_biases_that_do_not_fit_the_qkv_layout_are_refused(tmp_path):
    path = refused(tmp_path, "phi3", ("attn_q.bias",), tied=False)
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_q\.bias beside a fused blk\.0\.attn_qkv\.weight"):
        Engine(path, threads=1)
    path = refused(tmp_path, "llama", ("attn_qkv.bias",))
    with pytest.raises(ModelFileError, match=r"blk\.0\.attn_qkv\.bias is there without a fused "
                                             r"blk\.0\.attn_qkv\.weight .*llama.cpp refuses it too"):
        Engine(path, threads=1)
