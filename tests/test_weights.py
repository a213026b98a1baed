"""Weight identity: what changes the id, what does not, and the id cache."""
import json
import os
import shutil

import gguf
import pytest

from ctxengine import paths
from ctxengine.engine import weights
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.engine.weights import cached_weight_id, verify_weight_id, weight_id
from ctxengine.errors import ModelFileError
from test_gguf_file import small_tensors, write_gguf

# Pinned: a change here means snapshots made earlier no longer match their model.
# Change the encoding only together with weights.ENCODING and docs/weight-identity.md.
SMOLLM2_WEIGHT_ID = "fc7d16f1f407206b6842dd3d0aac7425e786a805dfb1a8d5baae0940ee9da99d"


@pytest.fixture(autouse=True)
def ctx_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CTX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def file_id(path) -> str:
    with open_gguf(path) as f:
        return weight_id(f)


def count_calls(monkeypatch, name: str) -> list:
    """The paths of the files weights.<name> (a function of an open GGUF) runs on, in order."""
    calls = []
    real = getattr(weights, name)

    def counting(f):
        calls.append(f.path)
        return real(f)

    monkeypatch.setattr(weights, name, counting)
    return calls


@pytest.fixture
def count_hashing(monkeypatch):
    return count_calls(monkeypatch, "weight_id")


# -- what the id covers ----------------------------------------------------------------
def test_smollm2_id_is_pinned_and_stable(smollm2_path):
    assert file_id(smollm2_path) == SMOLLM2_WEIGHT_ID
    assert file_id(smollm2_path) == SMOLLM2_WEIGHT_ID


def test_one_tensor_byte_changes_the_id(tmp_path, smollm2_path):
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    with open_gguf(copy) as f:
        pos = f.tensors["blk.7.ffn_down.weight"].offset + 1000
    with open(copy, "r+b") as out:
        out.seek(pos)
        byte = out.read(1)
        out.seek(pos)
        out.write(bytes([byte[0] ^ 0x01]))
    assert file_id(copy) != SMOLLM2_WEIGHT_ID


def test_chat_template_edit_keeps_the_id(tmp_path, smollm2_path):
    copy = tmp_path / "copy.gguf"
    data = smollm2_path.read_bytes()
    copy.write_bytes(data.replace(b"helpful AI assistant", b"HELPFUL ai ASSISTANT"))
    with open_gguf(copy) as f:
        assert "HELPFUL" in f.get("tokenizer.chat_template")
    assert file_id(copy) == SMOLLM2_WEIGHT_ID


def test_names_and_tokenizer_do_not_count(tmp_path):
    base = file_id(write_gguf(tmp_path / "a.gguf"))
    assert file_id(write_gguf(tmp_path / "b.gguf", name="another name")) == base
    assert file_id(write_gguf(tmp_path / "c.gguf", chat_template="{{ other }}")) == base
    assert file_id(write_gguf(tmp_path / "d.gguf", tokens=("x", "y", "z", "w"))) == base
    assert file_id(write_gguf(tmp_path / "e.gguf", alignment=128)) == base  # layout only


def test_hyperparameters_architecture_and_tensors_count(tmp_path):
    base = file_id(write_gguf(tmp_path / "a.gguf"))
    assert file_id(write_gguf(tmp_path / "b.gguf", context_length=128)) != base
    assert file_id(write_gguf(tmp_path / "c.gguf", arch="qwen2")) != base
    VT = gguf.GGUFValueType
    assert file_id(write_gguf(tmp_path / "d.gguf", extra={"llama.rope.freq_base": (1e4, VT.FLOAT32)})) != base
    renamed = {("output.weight" if k == "token_embd.weight" else k): v for k, v in small_tensors().items()}
    assert file_id(write_gguf(tmp_path / "e.gguf", tensors=renamed)) != base
    reordered = dict(reversed(list(small_tensors().items())))
    assert file_id(write_gguf(tmp_path / "f.gguf", tensors=reordered)) != base


def test_value_width_does_not_count(tmp_path):
    VT = gguf.GGUFValueType
    a = write_gguf(tmp_path / "a.gguf", extra={"llama.rope.freq_base": (0.5, VT.FLOAT32),
                                                "llama.embedding_length": (8, VT.UINT32)})
    b = write_gguf(tmp_path / "b.gguf", extra={"llama.embedding_length": (8, VT.UINT64),
                                                "llama.rope.freq_base": (0.5, VT.FLOAT64)})
    assert file_id(a) == file_id(b)  # same values (in another key order, too)


# -- the cache ---------------------------------------------------------------------------
def test_cache_hit_avoids_recompute(tmp_path, count_hashing, ctx_home):
    path = write_gguf(tmp_path / "m.gguf")
    first = cached_weight_id(path)
    assert cached_weight_id(path) == first == file_id(path)
    assert len(count_hashing) == 1
    cache = json.loads((paths.cache_dir() / weights.CACHE_FILE).read_text())
    assert cache["entries"][os.path.realpath(path)]["weight_id"] == first
    assert paths.cache_dir() == ctx_home / "cache"


def test_cache_follows_symlinks(tmp_path, count_hashing):
    path = write_gguf(tmp_path / "m.gguf")
    link = tmp_path / "link.gguf"
    link.symlink_to(path)
    assert cached_weight_id(path) == cached_weight_id(link)
    assert len(count_hashing) == 1


def test_mtime_change_invalidates(tmp_path, count_hashing):
    path = write_gguf(tmp_path / "m.gguf")
    cached_weight_id(path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    cached_weight_id(path)
    assert len(count_hashing) == 2


def test_rewritten_file_gets_its_new_id(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    old = cached_weight_id(path)
    write_gguf(tmp_path / "other.gguf", context_length=999).replace(path)  # new inode, size or mtime
    assert cached_weight_id(path) == file_id(path) != old


@pytest.mark.parametrize("junk", ["", "{not json", "[]", '{"encoding": "ctxengine-weights-v1", "entries": []}',
                                  '{"encoding": "ctxengine-weights-v0", "entries": {}}', "\x00\xff"])
def test_corrupt_cache_is_recomputed(tmp_path, count_hashing, junk):
    path = write_gguf(tmp_path / "m.gguf")
    cache = paths.cache_dir() / weights.CACHE_FILE
    cache.parent.mkdir(parents=True)
    cache.write_text(junk, encoding="latin-1")
    assert cached_weight_id(path) == file_id(path)
    assert len(count_hashing) == 1
    assert json.loads(cache.read_text())["encoding"] == "ctxengine-weights-v1"  # rewritten whole
    assert [p.name for p in cache.parent.iterdir()] == [weights.CACHE_FILE]   # no temp files left


def test_unwritable_cache_dir_is_tolerated(tmp_path, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("CTX_HOME", str(blocker))
    path = write_gguf(tmp_path / "m.gguf")
    assert cached_weight_id(path) == file_id(path)


def test_cache_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "MAX_CACHE_ENTRIES", 3)
    files = [write_gguf(tmp_path / f"m{i}.gguf", context_length=i + 1) for i in range(5)]
    for f in files:
        cached_weight_id(f)
    entries = json.loads((paths.cache_dir() / weights.CACHE_FILE).read_text())["entries"]
    assert list(entries) == [os.path.realpath(f) for f in files[2:]]


def test_verify_recomputes_and_corrects(tmp_path, count_hashing):
    path = write_gguf(tmp_path / "m.gguf")
    actual = file_id(path)
    assert verify_weight_id(path) == (None, actual)
    assert verify_weight_id(path) == (actual, actual)
    cache = paths.cache_dir() / weights.CACHE_FILE
    data = json.loads(cache.read_text())
    data["entries"][os.path.realpath(path)]["weight_id"] = "0" * 64  # bit rot the stat cannot see
    cache.write_text(json.dumps(data))
    assert verify_weight_id(path) == ("0" * 64, actual)
    assert cached_weight_id(path) == actual
    assert len(count_hashing) == 3  # each verify hashed; the last lookup hit the corrected entry


def test_missing_file_is_a_model_file_error(tmp_path):
    with pytest.raises(ModelFileError, match="cannot open"):
        cached_weight_id(tmp_path / "nope.gguf")
