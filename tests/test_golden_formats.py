"""Files of every released format, written once (tests/data/formats/README.md), read
by today's code: the store's format-1 and format-2 manifests parse under their
ids, every page decompresses to bytes whose BLAKE3 is its key, the export file
(format 1) imports, and each snapshot restored onto its weights continues with
the logits that recomputing its tokens gives."""
import json
import shutil

import blake3
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.store import pages as codec
from golden_formats import EXPECTED, EXPORT, STORE, write_tiny_gemma3

EXPECT = json.loads(EXPECTED.read_text())


@pytest.fixture
def golden_store(tmp_path):
    """A copy of the golden store: opening one writes LMDB's lock file beside it."""
    shutil.copytree(STORE, tmp_path / "store")
    with ce.Store(tmp_path / "store") as store:
        yield store


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    model = ce.load(write_tiny_gemma3(tmp_path_factory.mktemp("golden") / "tiny-gemma3.gguf"), threads=2)
    yield model
    model.close()


def check_manifest(store, ref: str, want: dict):
    sid = store.resolve(ref)
    assert sid == want["snapshot_id"]
    m = store.get_manifest(sid)  # parses only canonical bytes, whose BLAKE3 is the id
    assert (m.format_version, m.weight_id, m.kv_dtype) == (want["format_version"], want["weight_id"], want["kv_dtype"])
    assert m.token_ids == want["token_ids"] and m.n_tokens == len(m.token_ids)
    assert m.released_pages == want["released_pages"] and len(m.page_keys) == want["n_pages"]
    return m


def test_the_store_holds_both_manifest_formats(golden_store):
    assert set(golden_store.refs()) == set(EXPECT["store"])
    formats = {check_manifest(golden_store, ref, want).format_version for ref, want in EXPECT["store"].items()}
    assert formats == {1, 2}
    for ref in EXPECT["store"]:
        assert [e.new for e in golden_store.ref_log(ref)] == [EXPECT["store"][ref]["snapshot_id"]]


def test_every_page_decompresses_to_its_key(golden_store):
    keys = {k for want in EXPECT["store"].values() for k in golden_store.get_manifest(want["snapshot_id"]).page_keys}
    assert set(golden_store.page_keys()) == keys
    for key in sorted(keys):
        raw = codec.decode(key, golden_store.get_page_record(key))
        assert blake3.blake3(raw).hexdigest() == key
    assert golden_store.get_pages(sorted(keys))  # the restore path's reader verifies them too


def test_the_export_file_imports(tmp_path):
    assert EXPORT.read_bytes()[:12] == b"CTXSNAP\0" + (1).to_bytes(4, "little")
    with ce.Store(tmp_path / "store") as store:
        assert store.import_file(EXPORT, ref="imported") == EXPECT["export"]["snapshot_id"]
        check_manifest(store, "imported", EXPECT["export"])


def next_logits_both_ways(model, store, ref: str) -> tuple[np.ndarray, np.ndarray]:
    """Logits of one more token after the restored snapshot, and after recomputing its tokens."""
    ctx = model.restore(store, ref)
    probe = [model.tokenize(" Paris")[0]]
    restored = model.engine.forward(ctx._seq, probe)
    eng = model.engine
    recomputed = eng.forward(eng.new_sequence(), ctx.tokens + probe)
    ctx.delete()
    return restored, recomputed


def assert_same_logits(restored: np.ndarray, recomputed: np.ndarray):
    # Bit-identical when the writing and reading versions share their kernels (ctx verify);
    # a later version's kernels may round otherwise, but never by more than this.
    worst = float(np.max(np.abs(restored - recomputed)))
    assert worst <= 1e-3 * float(np.max(np.abs(recomputed))), f"largest difference {worst}"
    assert int(np.argmax(restored)) == int(np.argmax(recomputed))


def test_format_1_restores_onto_smollm2(golden_store, smollm2_path):
    model = ce.load(smollm2_path, threads=2)
    try:
        assert model.weight_id == EXPECT["store"]["smollm2-f16"]["weight_id"]
        assert_same_logits(*next_logits_both_ways(model, golden_store, "smollm2-f16"))
    finally:
        model.close()


def test_format_2_restores_onto_its_tiny_gemma3(golden_store, tiny_gemma3):
    assert tiny_gemma3.weight_id == EXPECT["store"]["tiny-gemma3"]["weight_id"]
    assert_same_logits(*next_logits_both_ways(tiny_gemma3, golden_store, "tiny-gemma3"))


def test_the_export_file_restores_onto_smollm2_q8(tmp_path, smollm2_path):
    model = ce.load(smollm2_path, threads=2, kv="q8")
    try:
        with ce.Store(tmp_path / "store") as store:
            store.import_file(EXPORT, ref="imported")
            assert_same_logits(*next_logits_both_ways(model, store, "imported"))
    finally:
        model.close()
