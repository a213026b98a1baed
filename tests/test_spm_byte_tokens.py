"""An SPM vocabulary missing byte tokens loaded, then failed on the first text needing
one with an error that named no file: now refused at load, naming the file."""
import subprocess
import sys
from pathlib import Path

import pytest

import ctxengine as ce
from ctxengine.errors import TokenizerError
from ctxengine.text.tokenizer import Tokenizer
from test_metadata_errors import VT, write_model


def spm_vocab(**changes) -> tuple[list[str], list[int]]:
    """A SentencePiece vocabulary: the 256 byte tokens, one word, BOS and EOS; ``changes``
    maps an id to its new text (its type becomes NORMAL unless it still spells a byte)."""
    tokens = [f"<0x{b:02X}>" for b in range(256)] + ["ab", "<s>", "</s>"]
    types = [6] * 256 + [1, 3, 3]
    for i, text in changes.items():
        tokens[int(i)] = text
    return tokens, types


def spm_model(path: Path, tokens: list[str], types: list[int]) -> Path:
    return write_model(path, {
        "tokenizer.ggml.add_space_prefix": (False, VT.BOOL),
        "tokenizer.ggml.model": ("llama", VT.STRING),
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY, VT.STRING),
        "tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32),
        "tokenizer.ggml.scores": ([0.0] * len(tokens), VT.ARRAY, VT.FLOAT32),
        "tokenizer.ggml.merges": None, "tokenizer.ggml.pre": None})


def test_an_spm_vocabulary_with_every_byte_loads_and_encodes(tmp_path):
    m = ce.load(spm_model(tmp_path / "bytes.gguf", *spm_vocab()), threads=1)
    try:
        ids = m.tokenize("A\u0080\u20acab")
        assert ids == [0x41, 0xC2, 0x80, 0xE2, 0x82, 0xAC, 256] and m.detokenize(ids) == "A\u0080\u20acab"
    finally:
        m.close()


@pytest.mark.parametrize("changes, shown", [
    ({"128": "X"}, r"<0x80>; text with those bytes"),
    ({"65": "<0x4g>"}, r"<0x41> \(these spell no byte: '<0x4g>' \(id 65\)\)"),
    ({"65": "<0x1FF>"}, r"<0x41> \(these spell no byte: '<0x1FF>' \(id 65\)\)"),
    ({str(b): f"x{b}" for b in range(0x80, 0x8a)}, r"10 of the 256 bytes: <0x80>, .*, <0x87> and 2 more"),
], ids=["a-byte-left-out", "a-bad-hex-digit", "three-digits", "ten-left-out"])
def test_an_spm_vocabulary_missing_byte_tokens_is_refused_at_load_naming_the_file(tmp_path, changes, shown):
    tokens, types = spm_vocab(**changes)
    for i, text in changes.items():
        types[int(i)] = 6 if text.startswith("<0x") else 1
    path = spm_model(tmp_path / "broken-bytes.gguf", tokens, types)
    with pytest.raises(TokenizerError, match=r"^broken-bytes.gguf: tokenizer.ggml.tokens has byte tokens "
                                             r"\(<0x00>...\) but none for .*" + shown):
        ce.load(path, threads=1)


def test_a_byte_token_in_lower_case_hex_is_its_byte(tmp_path):
    # llama.cpp reads <0x4a> as the byte 0x4A (strtol) but looks up only <0x4A>: it stood for
    # nothing when encoding, and a text with a "J" could not be encoded.
    tokens, types = spm_vocab(**{"74": "<0x4a>"})
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                                   "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": [0.0] * 259,
                                   "tokenizer.ggml.bos_token_id": 257, "tokenizer.ggml.eos_token_id": 258})
    assert tok.encode("J") == [0xE2, 0x96, 0x81, 74] and tok.token_bytes(74) == b"J"  # "\u2581J", in bytes


def test_an_spm_vocabulary_with_no_byte_tokens_still_loads():
    # no byte fallback at all (as a vocabulary may be): a text it cannot spell fails on use only
    from tiny_models import byte_vocab
    tokens = byte_vocab()
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                                   "tokenizer.ggml.token_type": [1] * 257 + [3, 3],
                                   "tokenizer.ggml.scores": [0.0] * 259, "tokenizer.ggml.add_space_prefix": False,
                                   "tokenizer.ggml.bos_token_id": 257, "tokenizer.ggml.eos_token_id": 258})
    assert tok.encode("ab") == [256]
    with pytest.raises(TokenizerError, match="no byte token for 0x"):
        tok.encode("\u20ac")


def test_ctx_tokenize_names_the_file_of_a_broken_vocabulary(tmp_path):
    path = spm_model(tmp_path / "broken.gguf", *spm_vocab(**{"65": "<0x4g>"}))
    out = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "tokenize", "-m", str(path), "hello"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "broken.gguf: tokenizer.ggml.tokens has byte tokens" in out.stderr, out.stderr
