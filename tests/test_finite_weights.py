"""Weights holding inf or NaN are refused at load, naming the file, tensor, block
and value (finite_weights.py); the check runs with the first hashing of a file
and its passing is cached with the weight id (weights.py)."""
import json
import os
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest

import ctxengine as ce
from ctxengine import _core, paths
from ctxengine.engine import finite_weights, weights
from ctxengine.engine.config import SUPPORTED_TYPES
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.errors import ModelFileError, UnsupportedModelError
from gguf_splits import write_split
from test_weights import count_calls
from tiny_models import K_QUANTS, TinyConfig, make_weights, write_gguf

T = gguf.GGMLQuantizationType
WIDE = dict(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=256)  # rows of whole K-quant blocks
TARGET = "blk.1.ffn_up.weight"
BLOCK = 5  # the block (or, for float types, the row) corrupted
INF16, NAN16 = b"\x00\x7c", b"\x00\x7e"
INF32, NAN32 = np.float32(np.inf).tobytes(), np.float32(np.nan).tobytes()

# The float fields of each block, from ggml-common.h (not from the module under test):
# (type, field, byte offset in the block, the bytes of inf, the bytes of NaN).
FIELDS = [
    ("Q4_0", "scale (d)", 0, INF16, NAN16),
    ("Q4_1", "scale (d)", 0, INF16, NAN16), ("Q4_1", "min (m)", 2, INF16, NAN16),
    ("Q5_0", "scale (d)", 0, INF16, NAN16),
    ("Q5_1", "scale (d)", 0, INF16, NAN16), ("Q5_1", "min (m)", 2, INF16, NAN16),
    ("Q8_0", "scale (d)", 0, INF16, NAN16),
    ("Q2_K", "scale (d)", 80, INF16, NAN16), ("Q2_K", "min scale (dmin)", 82, INF16, NAN16),
    ("Q3_K", "scale (d)", 108, INF16, NAN16),
    ("Q4_K", "scale (d)", 0, INF16, NAN16), ("Q4_K", "min scale (dmin)", 2, INF16, NAN16),
    ("Q5_K", "scale (d)", 0, INF16, NAN16), ("Q5_K", "min scale (dmin)", 2, INF16, NAN16),
    ("Q6_K", "scale (d)", 208, INF16, NAN16),
    ("Q8_K", "scale (d)", 0, INF32, NAN32),
]
FLOATS = {"F32": (INF32, NAN32), "F16": (INF16, NAN16), "BF16": (b"\x80\x7f", b"\xc0\x7f")}


@pytest.fixture(autouse=True)
def ctx_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CTX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(weights, "_known", {})
    monkeypatch.setattr(weights, "_failed", {})


@pytest.fixture
def checks(monkeypatch):
    """The paths check_finite_weights ran on, in order."""
    return count_calls(monkeypatch, "check_finite_weights")


def tiny(path, wtype="Q8_0"):
    cfg = TinyConfig(wtype=wtype, **(WIDE if wtype in K_QUANTS else {}))
    write_gguf(path, cfg, make_weights(cfg))
    return path


def load_and_close(path):
    model = ce.load(path, threads=1)
    try:
        assert len(model.weight_id) == 64
    finally:
        model.close()


def overwrite(path, tensor, at, data):
    """Write data at byte `at` of a tensor's bytes; returns the tensor's (type, row length, row bytes)."""
    with open_gguf(path) as f:
        t = f.tensors[tensor]
        where, info = t.offset + at, (t.ggml_type, t.shape[0], t.nbytes // int(np.prod(t.shape[1:])))
    with open(path, "r+b") as out:
        out.seek(where)
        out.write(data)
    return info


def test_every_type_the_engine_runs_is_checked():
    assert SUPPORTED_TYPES <= finite_weights.CHECKED
    assert {T[name] for name, *_ in FIELDS} | {T[name] for name in FLOATS} == SUPPORTED_TYPES
    assert {(T[name], what, at) for name, what, at, *_ in FIELDS} == {
        (t, what, at) for t, fields in finite_weights.BLOCK_FIELDS.items() for what, at, _ in fields}


@pytest.mark.parametrize("value", ["inf", "nan"])
@pytest.mark.parametrize("wtype, field, at, inf, nan", FIELDS, ids=[f"{t}-{w.split()[-1]}" for t, w, *_ in FIELDS])
def test_a_non_finite_block_field_is_named(tmp_path, wtype, field, at, inf, nan, value, monkeypatch):
    path = tiny(tmp_path / f"{wtype}.gguf", wtype)
    block, block_bytes = gguf.GGML_QUANT_SIZES[T[wtype]]
    ggml_type, n_in, row_bytes = overwrite(path, TARGET, BLOCK * block_bytes + at, inf if value == "inf" else nan)
    # The field is where the kernels read it: the engine's dequantizer turns that block non-finite, only it.
    row = BLOCK * block // n_in
    with open_gguf(path) as f:
        data = f.tensors[TARGET].data[row * row_bytes:(row + 1) * row_bytes]
        x = _core.quant.dequantize(ggml_type, data, n_in)
    first = BLOCK * block - row * n_in
    assert not np.isfinite(x[first:first + block]).any() and np.isfinite(np.delete(x, np.s_[first:first + block])).all()

    monkeypatch.setattr(_core, "Model", None)  # refused before the core loads anything
    with pytest.raises(ModelFileError) as err:
        ce.load(path)
    assert str(err.value) == (f"{wtype}.gguf: tensor {TARGET} holds a non-finite value ({value}) in the {field} "
                              f"of block {BLOCK} (row {row}); the file is corrupt")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("wtype", list(FLOATS))
def test_a_non_finite_float_weight_is_named(tmp_path, wtype, value, monkeypatch):
    path = tiny(tmp_path / f"{wtype}.gguf", wtype)
    inf, nan = FLOATS[wtype]
    bad = inf[:-1] + bytes([inf[-1] | 0x80]) if value == "-inf" else inf if value == "inf" else nan
    with open_gguf(path) as f:
        t = f.tensors[TARGET]
        n_in, row_bytes = t.shape[0], t.nbytes // t.shape[1]
    overwrite(path, TARGET, BLOCK * row_bytes + 3 * len(inf), bad)
    monkeypatch.setattr(_core, "Model", None)
    with pytest.raises(ModelFileError, match=rf"^{wtype}\.gguf: tensor {TARGET} holds a non-finite value "
                                             rf"\({value}\) at element {BLOCK * n_in + 3} \(row {BLOCK}\); "):
        ce.load(path)


@pytest.mark.parametrize("value", [INF32, NAN32], ids=["inf", "nan"])
def test_a_non_finite_norm_weight_is_named(tmp_path, value):
    path = tiny(tmp_path / "norm.gguf")
    overwrite(path, "blk.0.attn_norm.weight", 4 * 7, value)
    with pytest.raises(ModelFileError, match=r"tensor blk\.0\.attn_norm\.weight holds a non-finite value "
                                             r"\((inf|nan)\) at element 7; the file is corrupt"):
        ce.load(path)


def test_largest_finite_values_pass(tmp_path):
    path = tiny(tmp_path / "max.gguf")
    overwrite(path, TARGET, 0, b"\xff\x7b")  # f16 65504
    overwrite(path, TARGET, 34, b"\xff\xfb")  # f16 -65504
    overwrite(path, "output_norm.weight", 0, np.float32(np.finfo(np.float32).max).tobytes())
    load_and_close(path)


def test_a_good_file_is_checked_once_and_cached_as_checked(tmp_path, checks, monkeypatch):
    path = tiny(tmp_path / "good.gguf")
    load_and_close(path)
    assert checks == [path]
    entry = json.loads((paths.cache_dir() / weights.CACHE_FILE).read_text())["entries"][os.path.realpath(path)]
    assert entry[weights.CHECKED_FLAG] is True
    monkeypatch.setattr(weights, "_known", {})  # a new process: only the cache file knows
    load_and_close(path)
    assert checks == [path]


def test_an_entry_from_before_the_check_is_not_trusted(tmp_path, checks, monkeypatch):
    good = tiny(tmp_path / "good.gguf")
    wid = weights.cached_weight_id(good)
    bad = tiny(tmp_path / "bad.gguf")
    overwrite(bad, TARGET, 0, INF16)
    # An old entry for each: the stamp matches, the flag is missing.
    cache = paths.cache_dir() / weights.CACHE_FILE
    data = json.loads(cache.read_text())
    real_bad, stamp = weights._stamp(bad)
    data["entries"][real_bad] = {**stamp, "weight_id": wid}
    del data["entries"][os.path.realpath(good)][weights.CHECKED_FLAG]
    cache.write_text(json.dumps(data))
    monkeypatch.setattr(weights, "_known", {})
    with pytest.raises(ModelFileError, match="bad.gguf: tensor blk.1.ffn_up.weight holds a non-finite value"):
        weights.cached_weight_id(bad)
    assert weights.cached_weight_id(good) == wid
    assert checks == [good, bad, good]
    assert json.loads(cache.read_text())["entries"][os.path.realpath(good)][weights.CHECKED_FLAG] is True


def test_a_failed_file_is_never_cached_as_good(tmp_path, checks, monkeypatch):
    path = tiny(tmp_path / "bad.gguf")
    overwrite(path, TARGET, 34 * 3 + 1, b"\xff")  # d of block 3: NaN
    for _ in range(2):
        with pytest.raises(ModelFileError, match="block 3"):
            ce.load(path)
    assert checks == [path]  # asked again, the process remembers the failure, not a success
    cache = paths.cache_dir() / weights.CACHE_FILE
    assert not cache.exists() or os.path.realpath(path) not in json.loads(cache.read_text())["entries"]
    monkeypatch.setattr(weights, "_failed", {})  # a new process checks again
    with pytest.raises(ModelFileError, match="block 3"):
        weights.cached_weight_id(path)
    assert checks == [path, path]
    with pytest.raises(ModelFileError, match="block 3"):  # ctx models verify reads it all again
        weights.verify_weight_id(path)
    assert checks == [path, path, path]
    tiny(path)  # rewritten good: a new stamp
    assert weights.cached_weight_id(path) == weights.verify_weight_id(path)[1]


def test_ctx_models_verify_reports_it(tmp_path):
    path = tiny(tmp_path / "bad.gguf")
    overwrite(path, TARGET, 0, INF16)
    done = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "models", "verify", str(path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode != 0
    assert "bad.gguf: tensor blk.1.ffn_up.weight holds a non-finite value (inf) in the scale (d) of block 0" \
        in done.stderr


def test_a_type_without_a_known_layout_is_not_passed(tmp_path):
    cfg = TinyConfig(**WIDE)
    path = tmp_path / "iquant.gguf"
    write_gguf(path, cfg, make_weights(cfg), raw={TARGET: T.IQ4_NL})
    with open_gguf(path) as f, pytest.raises(UnsupportedModelError, match=f"tensor {TARGET} has type IQ4_NL"):
        finite_weights.check_finite_weights(f)


def test_a_split_model_names_the_part_that_holds_the_tensor(tmp_path):
    path = tiny(tmp_path / "whole.gguf")
    overwrite(path, "blk.1.ffn_down.weight", 34 * 2, NAN16)
    parts = write_split(path, tmp_path, "split", 3)
    with open_gguf(parts[0]) as f:
        holder = next(p.path.name for p in f.parts if "blk.1.ffn_down.weight" in p.tensors)
    with pytest.raises(ModelFileError, match=f"^{holder}: tensor blk.1.ffn_down.weight .* block 2 "):
        ce.load(parts[0])


def test_real_smollm2_with_one_q4_1_scale_set_to_inf(tmp_path, smollm2_path, monkeypatch):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path, copy)
    with open_gguf(copy) as f:
        assert f.tensors["blk.3.ffn_up.weight"].type_name == "Q4_1"
    overwrite(copy, "blk.3.ffn_up.weight", 1234 * 20, INF16)
    monkeypatch.setattr(_core, "Model", None)
    with pytest.raises(ModelFileError) as err:
        ce.load(copy)
    assert str(err.value).startswith("model.gguf: tensor blk.3.ffn_up.weight holds a non-finite value (inf) "
                                     "in the scale (d) of block 1234 (row ")
    assert str(err.value).endswith("; the file is corrupt")

