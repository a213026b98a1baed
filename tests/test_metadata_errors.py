"""Metadata that parses but makes no sense (a vocabulary of another size, a count
of zero, a number spelled as a string, a byte token that is no byte) is refused
at load with a ctxengine error naming the key and the value: never a Python
error from deep inside, nor a model that loads and fails on first use."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.catalog import ModelCatalog
from ctxengine.errors import CtxError, ModelFileError, RequestError, TokenizerError, UnsupportedModelError
from ctxengine.text.tokenizer import Tokenizer
from tiny_models import TinyConfig, byte_vocab, make_weights, write_gguf

VT = gguf.GGUFValueType
GEMMA3 = TinyConfig(arch="gemma3", n_layer=3, swa_window=4, swa_pattern=3)


def write_model(path: Path, meta: dict, cfg: TinyConfig = TinyConfig(), weights: dict | None = None) -> Path:
    """A tiny model with ``meta``'s keys changed: key -> (value, GGUFValueType[, element
    type]), or None to leave the key out."""

    class Writer(gguf.GGUFWriter):
        def add_key_value(self, key, val, vtype, sub_type=None):
            if key not in meta:  # those are written once, as given, below
                super().add_key_value(key, val, vtype, sub_type)

        def write_header_to_file(self, path=None):
            for key, spec in meta.items():
                if spec is not None:
                    super().add_key_value(key, *spec)
            super().write_header_to_file(path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", Writer)
        write_gguf(path, cfg, make_weights(cfg) if weights is None else weights)
    return path


# -- the tokenizer's vocabulary against the model's ----------------------------------

@pytest.mark.parametrize("n_tokens", [256, 262])
def test_a_tokenizer_of_another_size_than_the_embeddings_is_refused(tmp_path, n_tokens):
    # 262: ids 259..261 had no embedding (a bare IndexError on append); 256: the logits of
    # ids 256..258 had no text (a TokenizerError from every later decode).
    tokens = (byte_vocab() + [f"<x{i}>" for i in range(3)])[:n_tokens]
    path = write_model(tmp_path / "vocab.gguf", {
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY, VT.STRING),
        "tokenizer.ggml.token_type": ([1] * n_tokens, VT.ARRAY, VT.INT32),
    })
    with pytest.raises(ModelFileError, match=f"vocab.gguf: the tokenizer has {n_tokens} tokens "
                                             r"\(tokenizer.ggml.tokens\) but token_embd.weight has 259 rows"):
        ce.load(path, threads=1)


@pytest.mark.parametrize("shape", [(259 * 64,), (259, 1, 64)], ids=["1-D", "3-D"])
def test_token_embeddings_must_be_a_matrix(tmp_path, shape):
    weights = make_weights(TinyConfig())
    weights["token_embd.weight"] = weights["token_embd.weight"].reshape(shape)
    path = write_model(tmp_path / "embd.gguf", {}, weights=weights)
    ggml_shape = re.escape(str(list(reversed(shape))))  # GGUF lists the row length first
    with pytest.raises(ModelFileError, match=rf"token_embd.weight has shape {ggml_shape}, not \[n_embd, n_vocab\]"):
        ce.load(path, threads=1)


def test_a_weight_with_a_third_dimension_is_refused(tmp_path):
    # [64, 64, 2] loaded and ran on half of the tensor, silently
    weights = make_weights(TinyConfig())
    q = weights["blk.0.attn_q.weight"]
    weights["blk.0.attn_q.weight"] = np.stack([q, q])
    path = write_model(tmp_path / "q3d.gguf", {}, weights=weights)
    with pytest.raises(ModelFileError, match=r"q3d.gguf: tensor blk.0.attn_q.weight has shape \[64, 64, 2\]; "
                                             "the engine's weights have at most two dimensions"):
        ce.load(path, threads=1)
    weights["blk.0.attn_q.weight"] = q.reshape(1, *q.shape)  # a dimension of 1 is no dimension
    ce.load(write_model(tmp_path / "q1.gguf", {}, weights=weights), threads=1).close()


@pytest.mark.parametrize("cfg", [TinyConfig(), GEMMA3], ids=["llama", "gemma3"])
def test_a_block_count_beyond_the_files_blocks_is_refused_at_once(tmp_path, cfg):
    # gemma3 built a per-layer tuple of 2**31 - 1 first: the load hung, eating memory
    path = write_model(tmp_path / "blocks.gguf", {f"{cfg.arch}.block_count": (2**31 - 1, VT.UINT32)}, cfg)
    t = time.monotonic()
    with pytest.raises(ModelFileError, match=f"{cfg.arch}.block_count is 2147483647, and the file holds "
                                             f"no tensor of block {cfg.n_layer}"):
        ce.load(path, threads=1)
    assert time.monotonic() - t < 10


# -- hyperparameters ---------------------------------------------------------------

BAD_VALUES = [
    ("llama.attention.head_count", (0, VT.UINT32), "0"),
    ("llama.attention.head_count", (4.0, VT.FLOAT32), "4.0"),
    ("llama.attention.head_count", ("4", VT.STRING), "'4'"),
    ("llama.attention.head_count", (True, VT.BOOL), "True"),
    ("llama.block_count", (float("nan"), VT.FLOAT32), "nan"),
    ("llama.feed_forward_length", (float("inf"), VT.FLOAT64), "inf"),
    ("llama.embedding_length", (2**40, VT.UINT64), "1099511627776"),
    ("llama.context_length", (2**64 - 1, VT.UINT64), "18446744073709551615"),
    ("llama.context_length", (0, VT.UINT32), "0"),
    ("llama.attention.key_length", ([16, 16], VT.ARRAY, VT.UINT32), r"\[16, 16\]"),
    ("llama.attention.layer_norm_rms_epsilon", ("4", VT.STRING), "'4'"),
    ("llama.rope.freq_base", (1e300, VT.FLOAT64), "1e\\+300"),
    # these loaded, and every logit was NaN
    ("llama.rope.freq_base", (0.0, VT.FLOAT32), "0.0"),
    ("llama.rope.freq_base", (-10000.0, VT.FLOAT32), "-10000.0"),
    ("llama.attention.layer_norm_rms_epsilon", (-0.5, VT.FLOAT32), "-0.5"),
]


@pytest.mark.parametrize("key, spec, shown", BAD_VALUES, ids=[f"{k}={s}" for k, _, s in BAD_VALUES])
def test_a_bad_hyperparameter_is_named_with_its_value(tmp_path, key, spec, shown):
    path = write_model(tmp_path / "bad.gguf", {key: spec})
    with pytest.raises(ModelFileError, match=rf"bad.gguf: {key} is {shown}, not (an integer|a finite number|a number)"):
        ce.load(path, threads=1)


def test_a_string_rope_scaling_factor_is_named(tmp_path):
    path = write_model(tmp_path / "rope.gguf", {"llama.rope.scaling.type": ("linear", VT.STRING),
                                                "llama.rope.scaling.factor": ("x", VT.STRING)})
    with pytest.raises(ModelFileError, match="llama.rope.scaling.factor is 'x', not a finite number"):
        ce.load(path, threads=1)


def test_head_counts_per_layer_are_unsupported_not_a_crash(tmp_path):
    path = write_model(tmp_path / "per-layer.gguf", {"llama.attention.head_count_kv": ([2, 2], VT.ARRAY, VT.UINT32)})
    with pytest.raises(UnsupportedModelError, match=r"head_count_kv is given per layer \(\[2, 2\]\)"):
        ce.load(path, threads=1)


@pytest.mark.parametrize("key, spec, shown", [
    ("gemma3.attention.sliding_window", ("4", VT.STRING), "'4'"),
    ("gemma3.attention.sliding_window", (2**31, VT.UINT32), "2147483648"),
    ("gemma3.attention.sliding_window_pattern", ("x", VT.STRING), "'x'"),
    ("gemma3.attention.sliding_window_pattern", (["a", "b", "c"], VT.ARRAY, VT.STRING), r"\['a', 'b', 'c'\]"),
    ("gemma3.final_logit_softcapping", ("x", VT.STRING), "'x'"),
    ("gemma3.rope.freq_base_swa", (float("nan"), VT.FLOAT32), "nan"),
])
def test_a_bad_gemma3_option_is_named_with_its_value(tmp_path, key, spec, shown):
    path = write_model(tmp_path / "gemma.gguf", {key: spec}, cfg=GEMMA3)
    with pytest.raises(ModelFileError, match=rf"gemma.gguf: {key} is {shown}, not "):
        ce.load(path, threads=1)


def test_models_list_shows_a_file_with_a_bad_value_as_unservable(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    write_model(folder / "good.gguf", {})
    write_model(folder / "zero-heads.gguf", {"llama.attention.head_count": (0, VT.UINT32)})
    catalog = ModelCatalog()
    catalog.add_dir(folder)  # raised ZeroDivisionError: one bad file took every model's listing down
    errors = {e.name: e.error for e in catalog.entries()}
    assert errors["good"] is None
    assert errors["zero-heads"] == ("zero-heads.gguf: llama.attention.head_count is 0, "
                                    "not an integer from 1 to 2147483647")
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "models", "list", "--models-dir", str(folder),
                        "--no-ollama"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CTX_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    entries = {ln.split()[0]: ln for ln in r.stdout.splitlines()}
    assert "cannot" not in entries["good"]
    assert "cannot be served: zero-heads.gguf: llama.attention.head_count is 0" in entries["zero-heads"]


# -- gemma3 without a global layer ---------------------------------------------------

@pytest.mark.parametrize("cfg, meta", [
    (TinyConfig(arch="gemma3", n_layer=2, swa_window=4, swa_pattern=3), {}),
    (GEMMA3, {"gemma3.attention.sliding_window_pattern": (0, VT.UINT32)}),
    (GEMMA3, {"gemma3.attention.sliding_window_pattern": ([True] * 3, VT.ARRAY, VT.BOOL)}),
], ids=["fewer-layers-than-the-pattern", "pattern-0", "all-true"])
def test_gemma3_with_every_layer_sliding_is_refused_clearly(tmp_path, cfg, meta):
    path = write_model(tmp_path / "all-swa.gguf", meta, cfg=cfg)
    with pytest.raises(UnsupportedModelError, match=f"all-swa.gguf: all {cfg.n_layer} layers attend through "
                                                    "the sliding window"):
        ce.load(path, threads=1)


# -- tokenizer metadata --------------------------------------------------------------

def vocab_meta(model: str = "gpt2", **changes) -> dict:
    tokens = byte_vocab()
    meta = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * 257 + [3, 3], "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.bos_token_id": 257, "tokenizer.ggml.eos_token_id": 258}
    meta.update({f"tokenizer.ggml.{k}": v for k, v in changes.items()})
    return meta


@pytest.mark.parametrize("types, shown", [
    (["x"] * 259, "tokenizer.ggml.token_type\\[0\\] is 'x', not an integer"),
    ([1] * 100 + [float("nan")] * 159, "tokenizer.ggml.token_type\\[100\\] is nan, not an integer"),
    ([1] * 258 + [[3]], "tokenizer.ggml.token_type\\[258\\] is \\[3\\], not an integer"),
])
def test_a_token_type_that_is_no_integer_is_named(types, shown):
    with pytest.raises(TokenizerError, match=shown):
        Tokenizer.from_metadata(vocab_meta(token_type=types))


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_a_byte_token_must_be_spelled_as_its_byte(model):
    tokens = byte_vocab()
    tokens[65] = "<0x4g>"
    types = [1] * 257 + [3, 3]
    types[65] = 6
    with pytest.raises(TokenizerError, match=r"token '<0x4g>' has type BYTE \(6\) in tokenizer.ggml.token_type, "
                                             "but a byte token must be spelled <0xXX>"):
        Tokenizer.from_metadata(vocab_meta(model, tokens=tokens, token_type=types))
    tokens[65] = "<0x4a>"  # either case of hex digit, as llama.cpp's strtol reads it
    assert Tokenizer.from_metadata(vocab_meta(model, tokens=tokens, token_type=types)).token_bytes(65) == b"J"


def test_a_score_that_is_no_number_is_named():
    scores = [0.0] * 259
    scores[7] = "high"
    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores\\[7\\] is 'high', not a number"):
        Tokenizer.from_metadata(vocab_meta("llama", scores=scores))


def test_a_bad_token_type_in_a_file_is_a_tokenizer_error_at_load(tmp_path):
    path = write_model(tmp_path / "types.gguf", {
        "tokenizer.ggml.token_type": (["x"] * 259, VT.ARRAY, VT.STRING)})
    with pytest.raises(TokenizerError, match=r"types.gguf: tokenizer.ggml.token_type\[0\] is 'x'"):
        ce.load(path, threads=1)  # the file named, as for every other error at load


def test_a_context_length_of_no_tokens_is_refused_at_load(tmp_path):
    # n_ctx=0 loaded, and every append then failed with "the model's context length is 0"
    cfg = TinyConfig()
    write_gguf(tmp_path / "tiny.gguf", cfg, make_weights(cfg))
    for n_ctx in (0, -5, 2.5):
        with pytest.raises(RequestError, match=f"n_ctx must be a positive number of tokens, not {n_ctx}"):
            ce.load(tmp_path / "tiny.gguf", n_ctx=n_ctx)


@pytest.mark.parametrize("meta, message", [
    ({"tokenizer.ggml.bos_token_id": (100000, VT.UINT32), "tokenizer.chat_template": ("{{ bos_token }}", VT.STRING)},
     r"tiny\.gguf: tokenizer\.ggml\.bos_token_id is 100000: token id 100000 is out of range"),
    ({"tokenizer.chat_template": (7, VT.UINT32)}, r"tiny\.gguf: tokenizer\.chat_template is a int, not a string"),
])
def test_a_chat_template_or_its_token_that_cannot_be_read_names_the_file_and_key(tmp_path, meta, message):
    # These said neither the file nor, for the token id, the key ("token id 49152 is out of range").
    with pytest.raises(CtxError, match=message):
        ce.load(write_model(tmp_path / "tiny.gguf", meta), threads=1)
