"""Models the engine cannot run fail at load with a clear ctxengine error."""
import signal
import subprocess
import sys

import gguf
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.errors import ModelFileError, RequestError, UnsupportedModelError
from tiny_models import TinyConfig, make_weights, write_gguf


def test_unknown_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="architecture 'mamba'"):
        ce.load(path)


def test_longrope_is_refused_with_its_name(tmp_path):
    cfg = TinyConfig(arch="phi3")
    weights = make_weights(cfg)
    weights["rope_factors_long.weight"] = np.ones(cfg.head_dim // 2, np.float32)
    write_gguf(tmp_path / "phi3-128k.gguf", cfg, weights)
    with pytest.raises(UnsupportedModelError, match="LongRoPE"):
        ce.load(tmp_path / "phi3-128k.gguf")


@pytest.mark.parametrize("change, message", [
    # A tensor the model would not read: it ran without it, and gave wrong output with no error.
    (lambda w: w.update({"blk.0.mystery.weight": np.ones(8, np.float32)}), r"blk\.0\.mystery\.weight is not a tensor"),
    # block_count smaller than the blocks held: the last block was dropped in silence.
    ("fewer blocks", r"blk\.1\.attn_k\.weight, .* and \d+ more are not tensors of a gemma3 model with 1 blocks"),
    # A norm gemma3 needs, renamed away: that layer ran without it.
    (lambda w: w.pop("blk.1.post_attention_norm.weight"),
     r"missing tensor blk\.1\.post_attention_norm\.weight, which a gemma3 model needs"),
    (lambda w: w.pop("blk.0.attn_q_norm.weight"), r"missing tensor blk\.0\.attn_q_norm\.weight"),
    # block_count 2**31 - 1 with a tensor named for the last block: a tuple of 2**31 was built first.
    ("huge", r"gemma3\.block_count is 2147483647, and the file holds no tensor of block 2"),
])
def test_a_file_whose_tensors_are_not_the_models_is_refused(tmp_path, change, message):
    cfg = TinyConfig(arch="gemma3", n_layer=2, swa_window=16)
    weights = make_weights(cfg)
    if change == "fewer blocks":
        cfg = TinyConfig(arch="gemma3", n_layer=1, swa_window=16)
    elif change == "huge":
        weights["blk.2147483646.attn_norm.weight"] = np.ones(cfg.n_embd, np.float32)
    else:
        change(weights)
    write_gguf(tmp_path / "bad.gguf", cfg, weights)
    if change == "huge":  # the header says 2**31 - 1 blocks
        data = (tmp_path / "bad.gguf").read_bytes()
        key = b"gemma3.block_count"
        at = data.index(key) + len(key) + 4  # the value's type, then the uint32
        data = data[:at] + (2 ** 31 - 1).to_bytes(4, "little") + data[at + 4:]
        (tmp_path / "bad.gguf").write_bytes(data)
    with pytest.raises(ModelFileError, match=message):
        ce.load(tmp_path / "bad.gguf")


def test_unsupported_tensor_type_is_named(tmp_path):
    # A llama model with one IQ4_NL tensor (a type the kernels do not run).
    cfg = TinyConfig(n_embd=256, n_head=4, head_dim=64, n_ff=256)
    weights = make_weights(cfg)
    path = tmp_path / "iquant.gguf"
    write_gguf(path, cfg, weights, raw={"blk.0.ffn_up.weight": gguf.GGMLQuantizationType.IQ4_NL})
    with pytest.raises(UnsupportedModelError, match="tensor type IQ4_NL is not supported"):
        ce.load(path)


def test_truncated_file(tmp_path, smollm2_path):
    for cut in (10, 1000, 2_000_000, 60_000_000):
        bad = tmp_path / f"cut{cut}.gguf"
        with open(smollm2_path, "rb") as src:
            bad.write_bytes(src.read(cut))
        with pytest.raises(ModelFileError):
            ce.load(bad)


def test_missing_file():
    with pytest.raises(ce.CtxError):
        ce.load("/nonexistent/dir/model.gguf")


@pytest.mark.parametrize("threads", [-1, 100_000])
def test_a_thread_count_out_of_range_is_refused_before_any_thread_starts(tmp_path, threads):
    # 100,000 asked for 100,000 OS threads (the machine's load average passed 5,000)
    cfg = TinyConfig()
    write_gguf(tmp_path / "tiny.gguf", cfg, make_weights(cfg))
    with pytest.raises(RequestError, match=f"threads must be between 1 and 512, not {threads}"):
        ce.load(tmp_path / "tiny.gguf", threads=threads)


_TRUNCATED_WHILE_LOADED = """
import os, sys
import ctxengine as ce
m = ce.load(sys.argv[1], threads=1)
c = m.context(None)
c.append([1, 2, 3])
os.truncate(sys.argv[1], 4096)
list(c.generate(2, temperature=0))
"""


def test_a_model_file_truncated_while_loaded_is_named_as_the_process_dies(tmp_path):
    # The weights are mapped: reading a page the truncation took is a SIGBUS. The process
    # still dies (its weights are gone), but says which file and why instead of "Bus error".
    cfg = TinyConfig()
    path = tmp_path / "tiny.gguf"
    write_gguf(path, cfg, make_weights(cfg))
    assert path.stat().st_size > 8 * 4096
    r = subprocess.run([sys.executable, "-c", _TRUNCATED_WHILE_LOADED, str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr[-2000:])
    assert f"SIGBUS reading the model file {path} at byte" in r.stderr
    assert "truncated or rewritten in place while it was loaded" in r.stderr


_FEW_THREADS_ALLOWED = """
import resource, sys
import ctxengine as ce
from ctxengine.errors import CtxError
size = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:"))) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (768 << 20), resource.RLIM_INFINITY))
try:
    ce.load(sys.argv[1], threads=512)
except CtxError as err:
    print("refused:", err)
print("alive")
"""


def test_threads_the_system_refuses_are_an_error_not_an_abort(tmp_path):
    # std::thread's failure was thrown from the pool's constructor with threads already
    # started: std::terminate, the process gone ("terminate called without an active exception").
    cfg = TinyConfig()
    write_gguf(tmp_path / "tiny.gguf", cfg, make_weights(cfg))
    r = subprocess.run([sys.executable, "-c", _FEW_THREADS_ALLOWED, str(tmp_path / "tiny.gguf")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: tiny.gguf: cannot start 512 threads (the system refused thread" in r.stdout
    assert r.stdout.strip().endswith("alive")
