"""Reading GGUF files: the two real models, synthetic edge cases, and hostile input."""
import mmap
import os
import random
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from ctxengine.engine.gguf_file import GGUFFile, open_gguf
from ctxengine.errors import CtxError, ModelFileError

Q8_0 = gguf.GGMLQuantizationType.Q8_0


def small_tensors() -> dict:
    """Three tensors of three types; raw (bytes, type) pairs are stored as given."""
    rng = np.random.default_rng(0)
    return {
        "token_embd.weight": np.arange(24, dtype=np.float32).reshape(3, 8),
        "blk.0.attn_norm.weight": np.ones(8, dtype=np.float16),
        "blk.0.ffn_up.weight": (rng.integers(0, 256, (2, 34), dtype=np.uint8), Q8_0),
    }


def write_gguf(path: Path, *, arch: str = "llama", name: str = "tiny", chat_template: str = "{{ x }}",
               tokens=("a", "b", "<s>"), context_length: int = 64, tensors: dict | None = None,
               alignment: int | None = None, extra: dict | None = None) -> Path:
    """A small valid GGUF; extra maps key -> (value, GGUFValueType[, array element type])."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_block_count(1)
    w.add_token_list(list(tokens))
    w.add_chat_template(chat_template)
    if alignment:
        w.add_custom_alignment(alignment)
    for key, spec in (extra or {}).items():
        w.add_key_value(key, *spec)
    for tname, value in (small_tensors() if tensors is None else tensors).items():
        if isinstance(value, tuple):
            data, qtype = value
            w.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            w.add_tensor(tname, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def patched(data: bytes, pos: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


def tensor_info_pos(data: bytes, name: str) -> int:
    """Offset of the n_dims field of tensor `name`'s descriptor."""
    needle = struct.pack("<Q", len(name)) + name.encode()
    return data.index(needle) + len(needle)


def string_value_pos(data: bytes, key: str) -> int:
    """Offset of the length field of a string value."""
    needle = struct.pack("<Q", len(key)) + key.encode()
    return data.index(needle) + len(needle) + 4  # skip the u32 value type


@pytest.fixture
def small(tmp_path) -> Path:
    return write_gguf(tmp_path / "small.gguf")


def expect_error(tmp_path, data: bytes, match: str) -> None:
    """Opening data fails with a one-line ModelFileError naming the file."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelFileError, match=match) as info:
        open_gguf(path)
    message = str(info.value)
    assert message.startswith("bad.gguf") and "\n" not in message


# -- the real models -----------------------------------------------------------------
def test_smollm2_opens(smollm2_path):
    with open_gguf(smollm2_path) as f:
        assert f.version == 3 and f.arch == "llama"
        assert f.arch_key("context_length") == 8192
        assert f.get("llama.context_length") == 8192
        assert len(f.tensors) == 272
        embd = f.tensors["token_embd.weight"]
        assert embd.shape == (576, 49152) and embd.type_name == "Q8_0"
        assert embd.nbytes == 576 * 49152 // 32 * 34
        tokens = f.get("tokenizer.ggml.tokens")
        assert len(tokens) == 49152 and all(isinstance(t, str) for t in tokens[:100])
        assert isinstance(f.get("tokenizer.ggml.add_bos_token"), bool)
        assert "im_start" in f.get("tokenizer.chat_template")


def test_gemma3_opens_fast(gemma3_path):
    open_gguf(gemma3_path).close()  # warm the page cache
    start = time.perf_counter()
    with open_gguf(gemma3_path) as f:
        elapsed = time.perf_counter() - start
        assert f.arch == "gemma3" and f.arch_key("context_length") == 32768
        assert len(f.tensors) == 236
        assert len(f.get("tokenizer.ggml.tokens")) == 262144
        scores = f.get("tokenizer.ggml.scores")
        assert len(scores) == 262144 and isinstance(scores[0], float)
        assert {t.type_name for t in f.tensors.values()} >= {"Q4_K", "Q6_K", "F32"}
    assert elapsed < 1.5, f"opening Gemma took {elapsed:.2f} s"


def test_header_only_leaves_the_vocabulary_undecoded(gemma3_path, tmp_path):
    from ctxengine.engine.config import ModelConfig, unsupported_reason
    from ctxengine.engine.gguf_cursor import UnreadStrings

    with open_gguf(gemma3_path) as full, open_gguf(gemma3_path, header_only=True) as head:
        tokens = head.get("tokenizer.ggml.tokens")
        assert isinstance(tokens, UnreadStrings) and len(tokens) == 262144
        with pytest.raises(TypeError, match="header only"):
            tokens[0]
        assert head.get("tokenizer.ggml.scores") == full.get("tokenizer.ggml.scores")  # numbers are read
        assert head.tensors.keys() == full.tensors.keys() and head.data_offset == full.data_offset
        for name, t in head.tensors.items():  # all but the bytes, which a header read does not view
            assert t.data is None and (t.ggml_type, t.shape, t.offset, t.nbytes) == (
                full.tensors[name].ggml_type, full.tensors[name].shape, full.tensors[name].offset,
                full.tensors[name].nbytes) and full.tensors[name].data.nbytes == t.nbytes
        assert ModelConfig.from_gguf(head) == ModelConfig.from_gguf(full)
        assert unsupported_reason(head) == unsupported_reason(full) is None
    small = write_gguf(tmp_path / "small.gguf")
    with open_gguf(small, header_only=True) as f:  # short string arrays are read as ever
        assert f.get("tokenizer.ggml.tokens") == ["a", "b", "<s>"]


@pytest.mark.parametrize("cut", [500_000, 1_000_000])
def test_header_only_still_checks_the_vocabulary_bounds(tmp_path, smollm2_path, cut):
    path = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as src:
        path.write_bytes(src.read(cut))
    with pytest.raises(ModelFileError, match="truncated"):
        open_gguf(path, header_only=True)


def test_header_only_walk_fails_where_the_full_read_does(tmp_path, smollm2_path):
    """The header-only read walks the vocabulary natively (_core.gguf_skip_strings): cut
    anywhere in it, in a length or in a string's bytes, it refuses the file with the same
    words as the full read, which decodes every string in Python."""
    rng = np.random.default_rng(20261203)
    with open(smollm2_path, "rb") as src:
        data = src.read(2_000_000)
    for cut in sorted(rng.integers(40_000, 1_500_000, 12)) + [1_000_003, 1_000_004]:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ModelFileError) as full:
            open_gguf(path)
        with pytest.raises(ModelFileError) as head:
            open_gguf(path, header_only=True)
        assert str(head.value) == str(full.value)


def test_skip_strings_bounds():
    from ctxengine import _core

    def strings(*items: bytes) -> bytes:
        return b"".join(len(s).to_bytes(8, "little") + s for s in items)

    buf = strings(b"ab", b"", b"xyz")
    assert _core.gguf_skip_strings(buf, len(buf), 0, 3) == (len(buf), 3)
    assert _core.gguf_skip_strings(buf, len(buf), 0, 0) == (0, 0)
    assert _core.gguf_skip_strings(buf, len(buf) - 1, 0, 3) == (18, 2)   # the last string's bytes cut
    assert _core.gguf_skip_strings(buf, 17, 0, 3) == (10, 1)             # the second's length cut
    huge = (2**64 - 1).to_bytes(8, "little") + b"z"
    assert _core.gguf_skip_strings(huge, len(huge), 0, 1) == (0, 0)       # a length past the end, not a wrap
    with pytest.raises(ValueError):
        _core.gguf_skip_strings(buf, len(buf) + 1, 0, 1)


def test_smollm2_matches_gguf_reader(smollm2_path):
    # The reference reader is slow (seconds) but trusted on well-formed files.
    ref = gguf.GGUFReader(smollm2_path)
    with open_gguf(smollm2_path) as f:
        assert list(f.tensors) == [t.name for t in ref.tensors]
        for t, r in zip(f.tensors.values(), ref.tensors):
            assert (t.offset, t.nbytes, t.ggml_type) == (r.data_offset, r.n_bytes, r.tensor_type)
            assert t.shape == tuple(int(d) for d in r.shape)
        fields = {k: v.contents() for k, v in ref.fields.items() if not k.startswith("GGUF.")}
        assert f.metadata == fields


def test_tensor_data_is_a_view_of_the_mapping(smollm2_path):
    with open_gguf(smollm2_path) as f:
        a, b = f.tensors["token_embd.weight"], f.tensors["blk.0.attn_norm.weight"]
        for t in (a, b):
            assert t.data.dtype == np.uint8 and t.data.size == t.nbytes
            assert not t.data.flags.owndata and not t.data.flags.writeable
        whole = a.data.base
        assert whole is b.data.base and np.shares_memory(whole, a.data)
        assert isinstance(whole.base, memoryview) and isinstance(whole.base.obj, mmap.mmap)
        with open(smollm2_path, "rb") as raw:
            raw.seek(b.offset)
            assert raw.read(b.nbytes) == b.data.tobytes()


def test_unsupported_tensors_in_file_order(gemma3_path):
    with open_gguf(gemma3_path) as f:
        bad = f.unsupported_tensors({0, 8})
        assert bad and {t.type_name for t in bad} == {"Q4_K", "Q5_0", "Q6_K"}
        order = list(f.tensors)
        assert [order.index(t.name) for t in bad] == sorted(order.index(t.name) for t in bad)
        assert f.unsupported_tensors(set(range(64))) == []


# -- synthetic files -------------------------------------------------------------------
def test_matches_gguf_reader(small):
    ref = gguf.GGUFReader(small)
    with open_gguf(small) as f:
        assert list(f.tensors) == [t.name for t in ref.tensors]
        for t, r in zip(f.tensors.values(), ref.tensors):
            assert t.shape == tuple(int(d) for d in r.shape)
            assert t.ggml_type == r.tensor_type and t.offset == r.data_offset
            assert t.data.tobytes() == r.data.tobytes()
        assert list(f.metadata) == [k for k in ref.fields if not k.startswith("GGUF.")]
        assert f.get("tokenizer.ggml.tokens") == ["a", "b", "<s>"]
        assert f.get("general.name") == "tiny"


def test_every_value_type(tmp_path):
    VT = gguf.GGUFValueType
    extra = {
        "t.u8": (255, VT.UINT8), "t.i8": (-128, VT.INT8), "t.u16": (65535, VT.UINT16),
        "t.i16": (-32768, VT.INT16), "t.u32": (2**32 - 1, VT.UINT32), "t.i32": (-2**31, VT.INT32),
        "t.u64": (2**64 - 1, VT.UINT64), "t.i64": (-2**63, VT.INT64), "t.f32": (0.5, VT.FLOAT32),
        "t.f64": (0.1, VT.FLOAT64), "t.bool": (True, VT.BOOL), "t.str": ("héllo", VT.STRING),
        "t.empty": ("", VT.STRING),
        "t.ints": ([1, -2, 3], VT.ARRAY, VT.INT32), "t.floats": ([0.25, 1.5], VT.ARRAY, VT.FLOAT32),
        "t.bools": ([True, False], VT.ARRAY, VT.BOOL), "t.strs": (["x", "", "zz"], VT.ARRAY, VT.STRING),
        "t.nested": ([[1, 2], [3]], VT.ARRAY, VT.ARRAY),
        # every numeric element type at its extremes (decoded by struct, one call an array)
        "t.u8s": ([0, 255], VT.ARRAY, VT.UINT8), "t.i8s": ([-128, 127], VT.ARRAY, VT.INT8),
        "t.u16s": ([0, 65535], VT.ARRAY, VT.UINT16), "t.i16s": ([-32768, 32767], VT.ARRAY, VT.INT16),
        "t.u32s": ([0, 2**32 - 1], VT.ARRAY, VT.UINT32), "t.u64s": ([0, 2**64 - 1], VT.ARRAY, VT.UINT64),
        "t.i64s": ([-2**63, 2**63 - 1], VT.ARRAY, VT.INT64), "t.f64s": ([0.1, -1e300], VT.ARRAY, VT.FLOAT64),
        "t.f32s": ([0.1, float("inf")], VT.ARRAY, VT.FLOAT32),
    }
    with open_gguf(write_gguf(tmp_path / "types.gguf", extra=extra)) as f:
        for key, (value, *_) in extra.items():
            if key == "t.f32s":
                value = [float(np.float32(v)) for v in value]  # what a float32 holds of them
            assert f.get(key) == value and type(f.get(key)) is type(value), key
        assert type(f.get("t.ints")[0]) is int and type(f.get("t.bools")[0]) is bool


def test_custom_alignment(tmp_path):
    with open_gguf(write_gguf(tmp_path / "a.gguf", alignment=256)) as f:
        assert f.alignment == 256 and f.data_offset % 256 == 0
        assert all(t.offset % 256 == 0 for t in f.tensors.values())


def test_defaults_and_close(small):
    f = open_gguf(small)
    assert f.get("no.such.key", 7) == 7 and f.arch_key("no_such", "d") == "d"
    assert f.alignment == 32
    f.close()
    assert f.tensors == {}
    f.close()  # idempotent


def test_close_keeps_live_views_valid(small):
    f = open_gguf(small)
    view = f.tensors["token_embd.weight"].data
    expected = view.tobytes()
    f.close()  # the mapping cannot go while a view exists
    assert view.tobytes() == expected


def test_zero_tensors(tmp_path):
    with open_gguf(write_gguf(tmp_path / "empty.gguf", tensors={})) as f:
        assert f.tensors == {} and f.arch == "llama"


# -- bad input -----------------------------------------------------------------------
def test_not_a_file(tmp_path):
    with pytest.raises(ModelFileError, match="cannot open"):
        open_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ModelFileError, match="not a regular file"):
        open_gguf(tmp_path)


def test_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelFileError, match="not a regular file"):
        open_gguf(fifo)


def test_too_small(tmp_path):
    expect_error(tmp_path, b"", "too small")
    expect_error(tmp_path, b"GGUF\x03\x00\x00", "too small")


def test_bad_magic(tmp_path, small):
    expect_error(tmp_path, b"GGML" + small.read_bytes()[4:], "not a GGUF file")


@pytest.mark.parametrize("version,match", [(1, "version 1 is not supported"), (4, "version 4"),
                                           (3 << 24, "big-endian")])
def test_bad_version(tmp_path, small, version, match):
    expect_error(tmp_path, patched(small.read_bytes(), 4, "<I", version), match)


def test_huge_tensor_count(tmp_path, small):
    expect_error(tmp_path, patched(small.read_bytes(), 8, "<Q", 2**62), "claims 4611686018427387904 tensors")


def test_huge_kv_count(tmp_path, small):
    expect_error(tmp_path, patched(small.read_bytes(), 16, "<Q", 2**40), "more than a")


def test_huge_string_length(tmp_path, small):
    data = small.read_bytes()
    expect_error(tmp_path, patched(data, 24, "<Q", 2**63), "metadata key 0 is 9223372036854775808 bytes")
    pos = string_value_pos(data, "general.name")
    expect_error(tmp_path, patched(data, pos, "<Q", 2**63), "truncated: value of 'general.name'")


def test_huge_array_length(tmp_path, small):
    data = small.read_bytes()
    pos = string_value_pos(data, "tokenizer.ggml.tokens")  # an array: u32 element type, u64 count
    expect_error(tmp_path, patched(data, pos + 4, "<Q", 2**61), "array of 2305843009213693952 elements cannot fit")


def test_metadata_arrays_are_capped(tmp_path, monkeypatch):
    from ctxengine.engine import gguf_cursor  # the metadata readers live there

    monkeypatch.setattr(gguf_cursor, "MAX_METADATA_ELEMENTS", 4)
    data = write_gguf(tmp_path / "m.gguf", tokens=("a", "b", "c", "d", "e")).read_bytes()
    expect_error(tmp_path, data, "more than 4 elements in all")


def test_unknown_value_type(tmp_path, small):
    data = small.read_bytes()
    pos = string_value_pos(data, "general.name") - 4
    expect_error(tmp_path, patched(data, pos, "<I", 99), "unknown value type 99")


def test_invalid_utf8_key(tmp_path, small):
    data = small.read_bytes()
    pos = data.index(b"general.name")
    expect_error(tmp_path, data[:pos] + b"\xffeneral.name" + data[pos + 12:], "not valid UTF-8")


def test_messages_stay_on_one_line(tmp_path, small):
    data = small.read_bytes().replace(b"general.name", b"general\nname")
    pos = string_value_pos(data, "general\nname")
    expect_error(tmp_path, patched(data, pos, "<Q", 2**40), r"'general\\nname'")  # repr'd, one line


def test_value_strings_keep_undecodable_bytes(tmp_path, small):
    data = small.read_bytes()
    pos = data.index(b"tiny")
    path = tmp_path / "odd.gguf"
    path.write_bytes(data[:pos] + b"t\xffny" + data[pos + 4:])
    with open_gguf(path) as f:
        assert f.get("general.name").encode("utf-8", "surrogateescape") == b"t\xffny"


def test_duplicate_key(tmp_path):
    VT = gguf.GGUFValueType
    data = write_gguf(tmp_path / "d.gguf", extra={"t.aa": (1, VT.UINT32), "t.ab": (2, VT.UINT32)}).read_bytes()
    expect_error(tmp_path, data.replace(b"t.ab", b"t.aa"), "'t.aa' appears twice")


def test_missing_architecture(tmp_path, small):
    data = small.read_bytes().replace(b"general.architecture", b"general.architecturx")
    expect_error(tmp_path, data, "lacks general.architecture")
    expect_error(tmp_path, write_gguf(tmp_path / "noarch.gguf", arch="").read_bytes(), "lacks general.architecture")


@pytest.mark.parametrize("alignment", [0, 3, 48])
def test_bad_alignment(tmp_path, small, alignment):
    data = write_gguf(tmp_path / "a.gguf", alignment=64).read_bytes()
    pos = string_value_pos(data, "general.alignment")  # u32 value right after the type
    expect_error(tmp_path, patched(data, pos, "<I", alignment), "power of two")


def test_lying_tensor_offset(tmp_path, small):
    data = small.read_bytes()
    pos = tensor_info_pos(data, "blk.0.ffn_up.weight") + 4 + 2 * 8 + 4  # n_dims, 2 dims, type
    expect_error(tmp_path, patched(data, pos, "<Q", 2**40), "lies beyond the end")
    expect_error(tmp_path, patched(data, pos, "<Q", 2**64 - 32), "lies beyond the end")
    expect_error(tmp_path, patched(data, pos, "<Q", 33), "not aligned to 32")


def test_overlapping_tensors(tmp_path, small):
    data = small.read_bytes()
    pos = tensor_info_pos(data, "blk.0.attn_norm.weight") + 4 + 8 + 4
    expect_error(tmp_path, patched(data, pos, "<Q", 0), "overlap")


def test_duplicate_tensor_name(tmp_path):
    t = small_tensors()
    data = write_gguf(tmp_path / "d.gguf", tensors={"t.a": t["token_embd.weight"], "t.b": t["token_embd.weight"]})
    expect_error(tmp_path, data.read_bytes().replace(b"t.b", b"t.a"), "'t.a' appears twice")


def test_unknown_ggml_type(tmp_path, small):
    data = small.read_bytes()
    pos = tensor_info_pos(data, "token_embd.weight") + 4 + 2 * 8
    expect_error(tmp_path, patched(data, pos, "<I", 4), "unknown ggml type id 4")  # the removed Q4_2
    expect_error(tmp_path, patched(data, pos, "<I", 2**31), "unknown ggml type id")


@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_dimension_count(tmp_path, small, n_dims):
    data = small.read_bytes()
    pos = tensor_info_pos(data, "token_embd.weight")
    expect_error(tmp_path, patched(data, pos, "<I", n_dims), f"has {n_dims} dimensions")


def test_empty_or_huge_dimension(tmp_path, small):
    data = small.read_bytes()
    pos = tensor_info_pos(data, "token_embd.weight") + 4
    expect_error(tmp_path, patched(data, pos + 8, "<Q", 0), "empty dimension")
    expect_error(tmp_path, patched(data, pos + 8, "<Q", 2**63), "lies beyond the end")


def test_row_length_not_a_block_multiple(tmp_path, small):
    data = small.read_bytes()
    pos = tensor_info_pos(data, "blk.0.ffn_up.weight") + 4
    expect_error(tmp_path, patched(data, pos, "<Q", 16), "row length 16 is not a multiple of Q8_0's block size 32")


def test_long_tensor_name(tmp_path):
    t = small_tensors()["token_embd.weight"]
    with open_gguf(write_gguf(tmp_path / "ok.gguf", tensors={"n" * 63: t})) as f:
        assert list(f.tensors) == ["n" * 63]
    expect_error(tmp_path, write_gguf(tmp_path / "long.gguf", tensors={"n" * 64: t}).read_bytes(),
                 "tensor 0 name is 64 bytes long")


def test_truncated_small_file_everywhere(tmp_path, small):
    data = small.read_bytes()
    with open_gguf(small) as f:
        data_end = max(t.offset + t.nbytes for t in f.tensors.values())
    path = tmp_path / "cut.gguf"
    for cut in range(data_end):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelFileError):
            open_gguf(path)


@pytest.mark.parametrize("cut", [10, 24, 100, 1000, 500_000, 1_785_000, 1_785_700, 40_000_000])
def test_truncated_real_file(tmp_path, smollm2_path, cut):
    # header | metadata | tokens and merges | tensor descriptors | data (starts at 1785664)
    with open(smollm2_path, "rb") as src:
        expect_error(tmp_path, src.read(cut), "too small|truncated|beyond the end")


def test_truncated_by_one_byte(tmp_path, smollm2_path):
    with open(smollm2_path, "rb") as src:
        expect_error(tmp_path, src.read()[:-1], "beyond the end")


# -- fuzz ------------------------------------------------------------------------------
def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(6)
    pos = rng.randrange(len(b))
    if kind == 0:                       # flip a few bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:                     # random byte values
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 2:                     # truncate
        del b[pos:]
    elif kind == 3:                     # insert junk
        b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 4:                     # delete a slice
        del b[pos:pos + rng.randint(1, 16)]
    else:                               # an extreme u32 or u64 (counts, lengths, offsets)
        value = rng.choice([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, rng.getrandbits(64)])
        size = rng.choice([4, 8])
        pos = min(pos, len(b) - size)
        b[pos:pos + size] = (value % 2**(8 * size)).to_bytes(size, "little")
    return bytes(b)


def check_accepted(f: GGUFFile) -> None:
    """A mutant that opens must still be fully consistent."""
    assert f.arch
    spans = sorted((t.offset, t.offset + t.nbytes) for t in f.tensors.values())
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert e0 <= s1
    for t in f.tensors.values():
        assert t.offset % f.alignment == 0 and t.offset + t.nbytes <= f.size
        assert t.data.size == t.nbytes
        t.data.sum()  # touch every byte


def test_fuzz(tmp_path):
    data = write_gguf(tmp_path / "seed.gguf", extra={
        "t.nested": ([[1, 2], [3]], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.ARRAY),
        "t.floats": ([0.5, 1.5], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)}).read_bytes()
    rng = random.Random(20240601)
    path = tmp_path / "fuzz.gguf"
    start = time.perf_counter()
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(3000):
        mutant = mutate(rng, data)
        path.write_bytes(mutant)
        t0 = time.perf_counter()
        try:
            with open_gguf(path) as f:
                check_accepted(f)
            outcomes["accepted"] += 1
        except CtxError:
            outcomes["refused"] += 1
        except Exception as err:
            pytest.fail(f"case {case}: {type(err).__name__}: {err} escaped; mutant {mutant!r}")
        assert time.perf_counter() - t0 < 0.5, f"case {case} took too long"
    assert outcomes["refused"] > 1000 and outcomes["accepted"] > 100, outcomes
    assert time.perf_counter() - start < 20


def test_a_truncated_file_says_so_with_its_size_and_the_size_it_needs(tmp_path, smollm2_path):
    with open(smollm2_path, "rb") as src:  # cut inside the merges, as a broken download would
        expect_error(tmp_path, src.read(1_000_000), r"'tokenizer.ggml.merges': an array of 48900 elements .* "
                                                    r"truncated or corrupt \(it is 1000000 bytes; that array "
                                                    r"needs at least \d+\)")


def test_merges_far_past_the_vocabulary_are_refused_before_they_are_decoded(tmp_path):
    # 16.6M merges for SmolLM2's 49k tokens (a 460 MB file, under the element cap) took
    # 7.5 GB and two minutes to open; under a memory limit, a MemoryError traceback
    def many(n):
        return [f"m{i} x" for i in range(8 * 3 + 1024 + n)], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING
    ok = write_gguf(tmp_path / "ok.gguf", extra={"tokenizer.ggml.merges": many(0)})
    assert len(open_gguf(ok).metadata["tokenizer.ggml.merges"]) == 8 * 3 + 1024
    bad = write_gguf(tmp_path / "bad.gguf", extra={"tokenizer.ggml.merges": many(1)})
    expect_error(tmp_path, bad.read_bytes(), "tokenizer.ggml.merges lists 1,049 merges for a vocabulary of 3 tokens, "
                                             "more than 8 a token: the file is damaged or not a real tokenizer")
