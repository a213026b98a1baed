"""Snapshot store: pages, codec, manifests, refs, names, map growth, stats."""
import dataclasses
import os
import random
from pathlib import Path

import lmdb
import pytest

from ctxengine.errors import CorruptDataError, InvalidNameError, RefConflictError, StoreError
from ctxengine.store import Manifest, Store, page_key, validate_name
from ctxengine.store import pages as codec
from ctxengine.store.names import validate_client_name
from ctxengine.store.store import default_store_path

PAGE = 368 * 1024  # one 16-token page of SmolLM2 with an f16 KV


def rand_page(rng: random.Random, n: int = PAGE) -> bytes:
    return rng.randbytes(n)


def compressible_page(rng: random.Random, n: int = PAGE) -> bytes:
    # f16-ish: a few distinct byte pairs, like a KV with low-entropy high bytes
    return bytes(rng.choice(b"\x00\x3c\x01\x3c") for _ in range(n // 64)) * 64


def manifest(keys, *, page_tokens=16, **kw) -> Manifest:
    n = kw.pop("n_tokens", len(keys) * page_tokens)
    fields = dict(weight_id="w" * 64, model_name="smollm2", arch={"arch": "llama", "n_layer": 30},
                  kv_dtype="f16", page_tokens=page_tokens, token_ids=list(range(n)),
                  page_keys=list(keys), page_size=PAGE, n_tokens=n,
                  sampler_state={"temperature": 0.7, "rng": [1, 2, 3]}, created=1700000000.25)
    fields.update(kw)
    return Manifest(**fields)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store") as s:
        yield s


@pytest.fixture
def rng():
    return random.Random(1234)


# -- pages -------------------------------------------------------------------

def test_pages_round_trip_raw_and_zstd(store, rng):
    incompressible, compressible, small, empty = (rand_page(rng), compressible_page(rng),
                                                  b"tiny page", b"")
    keys = store.put_pages([incompressible, compressible, small, empty])
    assert keys == [page_key(p) for p in (incompressible, compressible, small, empty)]
    for key, raw in zip(keys, (incompressible, compressible, small, empty)):
        assert store.get_page(key) == raw
    assert codec.codec_of(store.get_page_record(keys[0])) == "raw"
    assert codec.codec_of(store.get_page_record(keys[1])) == "zstd"
    assert len(store.get_page_record(keys[1])) < PAGE // 4
    assert codec.codec_of(store.get_page_record(keys[2])) == "raw"  # too small to gain
    assert store.get_pages(keys[:2]) == [incompressible, compressible]


def test_put_page_verifies_and_reports_new(store, rng):
    raw = rand_page(rng, 1000)
    key = page_key(raw)
    assert store.put_page(key, raw) is True
    assert store.put_page(key.upper(), raw) is False  # already there; hex case does not matter
    with pytest.raises(CorruptDataError, match=page_key(b"other")):
        store.put_page(page_key(b"other"), raw)


def test_page_record_transfer(tmp_path, rng):
    raws = [rand_page(rng, 5000), compressible_page(rng, 64 * 100)]
    with Store(tmp_path / "a") as a, Store(tmp_path / "b") as b:
        keys = a.put_pages(raws)
        assert b.missing_pages(keys + keys) == keys  # deduplicated, in order
        for k in b.missing_pages(keys):
            assert b.put_page_record(k, a.get_page_record(k)) is True
        assert b.missing_pages(keys) == []
        assert [b.get_page(k) for k in keys] == raws
        bad = bytearray(a.get_page_record(keys[0]))
        bad[-1] ^= 1
        with pytest.raises(CorruptDataError, match=keys[0]):
            b.put_page_record(keys[0], bytes(bad))
        with pytest.raises(CorruptDataError):
            b.put_page_record(keys[0], a.get_page_record(keys[1]))  # a valid record, wrong key


def test_dedup_same_page_stored_once(store, rng):
    raw = rand_page(rng)
    k1, k2 = store.put_pages([raw, raw])
    assert k1 == k2 and store.page_keys() == [k1]
    store.snapshot(manifest([k1, k1, k1]), [raw], ref="a")
    store.snapshot(manifest([k1, k1], labels={"x": "y"}), {k1: raw}, ref="b")
    st = store.stats()
    assert st.n_pages == 1 and st.n_manifests == 2 and st.n_refs == 2
    assert st.unique_raw_bytes == PAGE and st.logical_bytes == 5 * PAGE
    assert st.dedup_ratio == pytest.approx(5.0)
    assert st.stored_bytes == PAGE + codec.HEADER_SIZE
    assert st.compression_ratio == pytest.approx(1.0, abs=1e-3)


def test_bad_keys_refused(store):
    for bad in ["xyz", "0" * 63, "g" * 64, " " * 64, 42]:
        with pytest.raises(StoreError):
            store.get_page(bad)
    with pytest.raises(StoreError, match="not in the store"):
        store.get_page("0" * 64)


# -- corruption ----------------------------------------------------------------

def test_byte_flipped_on_disk_is_caught_and_named(tmp_path, rng):
    path = tmp_path / "store"
    raws = [rand_page(rng) for _ in range(3)]
    with Store(path) as s:
        keys = s.put_pages(raws)
    # Find the stored bytes of page 1 in the data file and flip one in the middle.
    data_file = path / "data.mdb"
    blob = data_file.read_bytes()
    needle = raws[1][PAGE // 2: PAGE // 2 + 64]
    at = blob.index(needle)
    assert blob.count(needle) == 1
    with open(data_file, "r+b") as f:
        f.seek(at + 10)
        f.write(bytes([blob[at + 10] ^ 0x40]))
    with Store(path) as s:
        with pytest.raises(CorruptDataError, match=keys[1]):
            s.get_page(keys[1])
        with pytest.raises(CorruptDataError, match=keys[1]):
            s.get_pages(keys)
        assert s.get_page(keys[0]) == raws[0] and s.get_page(keys[2]) == raws[2]


@pytest.mark.parametrize("damage", ["zstd_payload", "wrong_record", "header", "short"])
def test_bad_record_written_through_lmdb(store, rng, damage):
    good = compressible_page(rng)
    other = compressible_page(rng)
    key, other_key = store.put_pages([good, other])
    record = bytearray(store.get_page_record(key))
    if damage == "zstd_payload":
        record[len(record) // 2] ^= 0xFF
    elif damage == "wrong_record":
        record = bytearray(store.get_page_record(other_key))
    elif damage == "header":
        record[0:4] = b"XXXX"
    else:
        record = record[:8]
    with store.env.env.begin(write=True) as txn:  # bypass the store, as a bad disk would
        txn.put(bytes.fromhex(key), bytes(record), db=store.dbs["pages"])
    with pytest.raises(CorruptDataError, match=key):
        store.get_page(key)
    assert store.get_page(other_key) == other


def _rle_frame(n: int, declare: bool) -> bytes:
    """A zstd frame of n zero bytes in RLE blocks of 128 KiB: 4 bytes a block, so
    32 KB expand to 1 GiB (RFC 8878: frame header with or without its content size)."""
    head = bytes([0b11100000]) + n.to_bytes(8, "little") if declare else bytes([0, 0x58])
    blocks = b"".join((((128 << 10) << 3) | 2 | (i == n // (128 << 10) - 1)).to_bytes(3, "little") + b"\0"
                      for i in range(n // (128 << 10)))
    return (0xFD2FB528).to_bytes(4, "little") + head + blocks


@pytest.mark.parametrize("header,frame", [
    (1 << 30, _rle_frame(1 << 30, True)),   # both say 1 GiB: past what a record may hold
    (4096, _rle_frame(1 << 30, False)),     # the header says 4 KiB, the frame runs on to 1 GiB
    (4096, _rle_frame(1 << 30, True)[:13] + _rle_frame(4096, True)[13:]),  # the frame declares 1 GiB
], ids=["header", "undeclared", "declared"])
def test_a_decompression_bomb_is_refused_before_it_expands(header, frame):
    """A 32 KB record that would expand to 1 GiB (a hostile peer's PutPages, an
    imported file) is refused without allocating it: it took 1.1 GB of a
    server's memory before its BLAKE3 check could fail."""
    import resource
    record = codec._HEADER.pack(codec.RECORD_MAGIC, codec.RECORD_VERSION, codec.CODEC_ZSTD, 0, header) + frame
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CorruptDataError, match="00" * 32):
        codec.decode("00" * 32, record)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10  # KiB: under 100 MiB
    with pytest.raises(StoreError, match="more than a record"):
        codec.encode(bytes(codec.MAX_RAW_LEN + 1))


# -- manifests -------------------------------------------------------------------

@pytest.mark.parametrize("change", [
    (b'"labels":{}', b'"labels":{"k":"\\ud800"}'),                       # a lone surrogate: no UTF-8 for it
    (b'"arch":{', b'"arch":{"deep":' + b"[" * 1000 + b"]" * 1000 + b','),  # nested past any real manifest
    (b'"arch":{', b'"arch":{"deep":' + b"[" * 100000 + b"]" * 100000 + b','),  # past Python's recursion
], ids=["surrogate", "nested", "nested-deeper"])
def test_a_hostile_manifest_is_corrupt_data(change):
    """Each was a bare UnicodeEncodeError or RecursionError (a gRPC UNKNOWN, a CLI traceback)."""
    data = manifest(["ab" * 32], n_tokens=10).canonical_bytes()
    assert change[0] in data
    with pytest.raises(CorruptDataError, match="manifest"):
        Manifest.from_bytes(data.replace(change[0], change[1], 1))


def test_labels_must_be_text_a_manifest_can_hold():
    from ctxengine.store.manifest import checked_labels
    with pytest.raises(StoreError, match="surrogate"):
        checked_labels({"k": "\udcff"})
    with pytest.raises(StoreError, match="surrogate"):
        checked_labels({"\ud800": "v"})
    with pytest.raises(StoreError, match="strings"):
        checked_labels({"k": 1})
    assert checked_labels({"k": "ünïcode ✓"}) == {"k": "ünïcode ✓"} and checked_labels(None) == {}


def test_manifest_id_stable_and_verified(store, rng):
    raws = [rand_page(rng, 4096) for _ in range(3)]
    keys = store.put_pages(raws)
    m = manifest(keys, n_tokens=40, token_ids=list(range(41)), labels={"who": "tëst"})
    sid = store.put_manifest(m)
    assert sid == m.snapshot_id() == manifest(keys, n_tokens=40, token_ids=list(range(41)),
                                               labels={"who": "tëst"}).snapshot_id()
    assert store.put_manifest(m) == sid  # idempotent
    back = store.get_manifest(sid)
    assert back == m and back.canonical_bytes() == m.canonical_bytes()
    assert store.snapshots() == [sid]
    # Any field change changes the id.
    assert manifest(keys, n_tokens=40, token_ids=list(range(41))).snapshot_id() != sid
    # A manifest record altered in the db is refused, naming the id.
    with store.env.env.begin(write=True) as txn:
        bad = codec.encode(m.canonical_bytes().replace(b"smollm2", b"smollm3"))
        txn.put(bytes.fromhex(sid), bad, db=store.dbs["manifests"])
    with pytest.raises(CorruptDataError, match=sid):
        store.get_manifest(sid)


def test_manifest_hex_case_does_not_matter(store, rng):
    raws = [rand_page(rng, 300) for _ in range(2)]
    upper = [page_key(r).upper() for r in raws]
    sid = store.snapshot(manifest(upper), {k: r for k, r in zip(upper, raws)}, ref="main")
    assert sid == manifest([k.lower() for k in upper]).snapshot_id()
    assert store.get_manifest(sid).page_keys == [k.lower() for k in upper]
    assert store.put_manifest(manifest(upper, parent=sid.upper())) == \
        manifest([k.lower() for k in upper], parent=sid).snapshot_id()


def test_manifest_needs_its_pages(store, rng):
    raw = rand_page(rng, 100)
    with pytest.raises(StoreError, match="lacks"):
        store.put_manifest(manifest([page_key(raw)]))
    assert store.snapshots() == []


def test_canonical_bytes_format(rng):
    m = manifest(["ab" * 32], sampler_state={"b": 1, "a": (1.5, None, True)}, labels={"k": "ü"})
    data = m.canonical_bytes()
    assert data.startswith(b'{"arch":{"arch":"llama","n_layer":30},"created":1700000000.25,')
    assert b" " not in data and "ü".encode() in data
    assert b'"sampler_state":{"a":[1.5,null,true],"b":1}' in data
    back = Manifest.from_bytes(data)
    assert back.sampler_state["a"] == [1.5, None, True] and back.canonical_bytes() == data
    # Non-canonical spellings of the same object are refused (one manifest, one id).
    with pytest.raises(CorruptDataError, match="canonical"):
        Manifest.from_bytes(data.replace(b'"created":1700000000.25,', b'"created": 1700000000.25,'))


@pytest.mark.parametrize("change, match", [
    (dict(format_version=3), "format version"),
    (dict(format_version=2), "released_pages"),            # format 2 means some released pages
    (dict(format_version=2, released_pages=3), "released_pages"),  # more than the full pages
    (dict(released_pages=1), "unknown"),                   # format 1 has no such field
    (dict(page_tokens=0), "page_tokens"),
    (dict(page_tokens=True), "page_tokens"),
    (dict(n_tokens=33, token_ids=list(range(40))), "pages for 33 tokens"),
    (dict(n_tokens=16), "2 pages for 16 tokens"),
    (dict(token_ids=list(range(10))), "exceeds"),
    (dict(token_ids=[-1] * 32), "token_ids"),
    (dict(token_ids="abc"), "token_ids"),
    (dict(page_keys=["nothex"] * 2), "page_keys"),
    (dict(weight_id=""), "weight_id"),
    (dict(kv_dtype=5), "kv_dtype"),
    (dict(parent="abc"), "parent"),
    (dict(created=float("nan")), "created"),
    (dict(labels={"a": 1}), "labels"),
    (dict(sampler_state={"x": float("inf")}), "infinity"),
    (dict(sampler_state={1: "x"}), "non-string key"),
    (dict(arch={"x": object()}), "JSON data"),
])
def test_malformed_manifests_refused(change, match):
    m = manifest(["ab" * 32, "cd" * 32])
    for k, v in change.items():
        setattr(m, k, v)
    with pytest.raises(StoreError, match=match):
        m.canonical_bytes()


def test_format_2_only_when_pages_are_released():
    """A manifest without released pages keeps format 1's bytes (and id); one with
    them is format 2 and round-trips."""
    m = manifest(["ab" * 32, "cd" * 32])
    assert m.format_version == 1 and b"released_pages" not in m.canonical_bytes()
    r = Manifest(**{**dataclasses.asdict(m), "released_pages": 1})
    assert r.format_version == 2
    back = Manifest.from_bytes(r.canonical_bytes())
    assert back.released_pages == 1 and back.snapshot_id() == r.snapshot_id() != m.snapshot_id()


def test_from_bytes_rejects_garbage():
    for data in [b"\xff\xfe", b"[]", b"{}", b'{"format_version":1}', b"not json"]:
        with pytest.raises(CorruptDataError):
            Manifest.from_bytes(data)


# -- refs --------------------------------------------------------------------------

def test_refs_and_log(store, rng):
    raws = [rand_page(rng, 256) for _ in range(4)]
    s1 = store.snapshot(manifest([page_key(raws[0])]), raws[:1], ref="main")
    s2 = store.snapshot(manifest([page_key(r) for r in raws[:2]], parent=s1), raws[:2], ref="main")
    store.set_ref("feature/x", s1)
    store.set_ref("main", s2)  # no-op move: not logged
    assert store.refs() == {"main": s2, "feature/x": s1}
    log = store.ref_log("main")
    assert [(e.old, e.new) for e in log] == [(None, s1), (s1, s2)]
    assert log[0].time <= log[1].time
    store.set_ref("main", s1)
    assert [(e.old, e.new) for e in store.ref_log("main")][-1] == (s2, s1)
    assert store.resolve("main") == s1 and store.resolve("feature/x") == s1
    with pytest.raises(StoreError, match="no such snapshot"):
        store.set_ref("main", "0" * 64)
    store.delete_ref("main")
    assert store.refs() == {"feature/x": s1}
    with pytest.raises(StoreError):
        store.ref_log("main")
    with pytest.raises(StoreError):
        store.delete_ref("main")
    store.set_ref("main", s2)  # a recreated ref starts a fresh log
    assert [(e.old, e.new) for e in store.ref_log("main")] == [(None, s2)]
    assert [(e.old, e.new) for e in store.ref_log("feature/x")] == [(None, s1)]


def test_a_conditional_ref_move_is_a_compare_and_set(store, rng):
    # Two `ctx gen` on one context both saved, and the second silently dropped the first's tokens:
    # a move with expect= happens only if the ref still holds what the writer read.
    raws = [rand_page(rng, 256) for _ in range(3)]
    s1 = store.snapshot(manifest([page_key(raws[0])]), raws[:1])
    s2 = store.snapshot(manifest([page_key(raws[1])], parent=s1), raws[1:2])
    store.set_ref("main", s1, expect=None)  # None: create it only if absent
    for sid, expect in ((s2, None), (s2, s2), (s2, "f" * 64)):
        with pytest.raises(RefConflictError, match=f"'main' is at {s1[:12]}"):
            store.set_ref("main", sid, expect=expect)
    assert store.refs() == {"main": s1} and len(store.ref_log("main")) == 1  # a refused move logs nothing
    store.set_ref("main", s2, expect=s1.upper())
    assert [(e.old, e.new) for e in store.ref_log("main")] == [(None, s1), (s1, s2)]
    with pytest.raises(RefConflictError, match="'gone' does not exist"):
        store.set_ref("gone", s2, expect=s1)

    # The same check inside snapshot(): refused, it stores nothing at all.
    m3 = manifest([page_key(raws[2])], parent=s1)
    with pytest.raises(RefConflictError, match=rf"'main' is at {s2[:12]} \(this move expected {s1[:12]}\)"):
        store.snapshot(m3, raws[2:], ref="main", expect=s1)
    assert store.missing_pages([page_key(raws[2])]) and m3.snapshot_id not in store.snapshots()
    assert store.refs() == {"main": s2} and len(store.ref_log("main")) == 2
    s3 = store.snapshot(m3, raws[2:], ref="main", expect=s2)
    with pytest.raises(RefConflictError, match=rf"'main' is at {s3[:12]} \(this move expected no ref\)"):
        store.snapshot(manifest([page_key(raws[0])], labels={"x": "y"}), raws[:1], ref="main", expect=None)
    store.set_ref("main", s1)  # without expect= a move is unconditional, as before
    assert [e.new for e in store.ref_log("main")] == [s1, s2, s3, s1]


def test_resolve_by_prefix(store, rng):
    raw = rand_page(rng, 64)
    key = store.put_pages([raw])[0]
    ids = [store.put_manifest(manifest([key], labels={"i": str(i)})) for i in range(40)]
    for sid in ids[:5]:
        assert store.resolve(sid) == sid
        assert store.resolve(sid.upper()) == sid
        assert store.resolve(sid[:12]) == sid
    with pytest.raises(StoreError, match="no ref or snapshot"):
        store.resolve(ids[0][:7])  # too short to count as a prefix
    with pytest.raises(StoreError):
        store.resolve("f" * 64 if "f" * 64 not in ids else "e" * 64)
    with pytest.raises(StoreError):
        store.resolve("../etc")
    # Two ids sharing 9 hex digits (planted directly: only their keys matter here).
    twins = ["abcdef012" + c * 55 for c in "01"]
    with store.env.env.begin(write=True) as txn:
        for t in twins:
            txn.put(bytes.fromhex(t), b"", db=store.dbs["manifests"])
    with pytest.raises(StoreError, match="ambiguous"):
        store.resolve("abcdef01")
    with pytest.raises(StoreError, match="ambiguous"):
        store.resolve("ABCDEF012")  # odd length
    assert store.resolve("abcdef0120") == twins[0]
    store.set_ref(ids[1][:8], ids[2])  # a ref spelled like an id prefix wins
    assert store.resolve(ids[1][:8]) == ids[2]


# -- names ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "../x", "a/../b", "x/..", ".", "/abs", "a//b", "a/",
                                  "x" * 200, "x" * 129, "a\x00b", "a\nb", "a\x7fb",
                                  "a b", "é", "a:b", "a\\b", None, 5])
def test_bad_names(store, name):
    with pytest.raises(InvalidNameError):
        validate_name(name, "context")
    with pytest.raises(InvalidNameError):
        store.set_ref(name, "0" * 64)


@pytest.mark.parametrize("name", ["main", "a/b/c", "v1.2_x-Y", "x" * 128, "..a", ".hidden", "a..b"])
def test_good_names(name):
    assert validate_name(name) == name


def test_name_messages():
    with pytest.raises(InvalidNameError, match="context name '../x'.*'..'"):
        validate_name("../x", "context")
    with pytest.raises(InvalidNameError, match="200 characters"):
        validate_name("x" * 200)


def test_client_names_exclude_the_servers_own():
    for name in ("_evicted/999999-1/mine", "_prefix", "_"):
        with pytest.raises(InvalidNameError, match=f"context names starting with '_' are reserved.*{name!r}"):
            validate_client_name(name)
    for name in ("a_b", "x/_y", "main"):
        assert validate_client_name(name) == name
    with pytest.raises(InvalidNameError, match="'..'"):
        validate_client_name("../x")


# -- environment -----------------------------------------------------------------------

def test_map_full_grows(tmp_path, rng):
    with Store(tmp_path / "s", map_size=64 * 1024) as s:
        start = s.env.map_size()
        raws = [rand_page(rng, 100_000) for _ in range(30)]
        keys = [s.put_pages([r])[0] for r in raws]               # many small writes
        big = [rand_page(rng) for _ in range(8)]                  # one ~3 MB snapshot
        sid = s.snapshot(manifest([page_key(b) for b in big]), big, ref="big")
        # A write with no size hint fills the map mid-transaction and is replayed.
        more = {page_key(r): codec.encode(r) for r in (rand_page(rng) for _ in range(12))}
        runs = []
        s.env.write(lambda txn: (runs.append(1), s._put_records(txn, more)))
        assert len(runs) > 1 and s.env.map_size() > start
        assert [s.get_page(k) for k in keys] == raws
        assert s.get_pages(s.get_manifest(sid).page_keys) == big
        assert all(s.get_page(k) for k in more)


def test_threads_share_a_growing_store(tmp_path):
    import threading

    errors = []
    with Store(tmp_path / "s", map_size=64 * 1024) as s:
        def work(seed):
            try:
                r = random.Random(seed)
                for _ in range(15):
                    raws = [r.randbytes(r.randint(1, 60_000)) for _ in range(3)]
                    keys = s.put_pages(raws)
                    assert s.get_pages(keys) == raws  # reads while others grow the map
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(s.page_keys()) == 4 * 15 * 3


def test_same_path_twice_in_one_process(tmp_path, rng):
    a = Store(tmp_path / "s")
    b = Store(tmp_path / "s")  # LMDB forbids two envs on one path per process: shared
    key = a.put_pages([b"x" * 10])[0]
    a.close()
    assert b.get_page(key) == b"x" * 10
    b.close()
    b.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        b.get_page(key)


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("CTX_STORE", str(tmp_path / "env-store"))
    assert default_store_path() == tmp_path / "env-store"
    monkeypatch.delenv("CTX_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "xdg" / "ctxengine" / "store"
    with Store() as s:
        assert s.path == tmp_path / "xdg" / "ctxengine" / "store"
        assert (s.path / "data.mdb").exists()
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_store_path() == Path.home() / ".local" / "share" / "ctxengine" / "store"


def test_an_empty_path_is_refused_not_taken_for_the_current_directory(monkeypatch, tmp_path):
    # Path("") is ".": `ctx ls --store ""` made a store in whatever directory it ran in.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="store path is empty"):
        Store("")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("CTX_STORE", "")  # an empty variable is an unset one, as in the shell
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "xdg" / "ctxengine" / "store"


def test_newer_store_format_refused(tmp_path):
    path = tmp_path / "s"
    Store(path).close()
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"99", db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(StoreError, match="format 99"):
        Store(path)
    # The failed open released its environment (LMDB would refuse a second one).
    env = lmdb.open(str(path), max_dbs=8)
    env.close()


def test_store_imports_nothing_else_of_ours():
    root = Path(__file__).resolve().parents[1] / "ctxengine" / "store"
    for f in root.glob("*.py"):
        for line in f.read_text().splitlines():
            s = line.strip()
            if s.startswith(("from ..", "import ctxengine", "from ctxengine")):
                assert s.startswith("from ..errors import"), f"{f.name}: {s}"


def test_unusable_path_is_a_store_error(tmp_path):
    (tmp_path / "file").write_bytes(b"not a directory")
    with pytest.raises(StoreError, match="cannot"):
        Store(tmp_path / "file")
    with pytest.raises(StoreError, match="cannot"):
        Store(tmp_path / "file" / "sub")


def test_a_truncated_data_file_is_refused_before_lmdb_maps_it(tmp_path):
    # LMDB trusts the page numbers in its map: the first read past the end of a truncated
    # data.mdb (a partial copy, a full disk) killed the process with SIGBUS.
    import subprocess
    import sys
    rng = random.Random(7)
    path = tmp_path / "s"
    with Store(path) as s:
        s.put_pages([rand_page(rng) for _ in range(8)])
    data = path / "data.mdb"
    whole = data.stat().st_size
    for size in (8192, 12288, whole // 2):
        os.truncate(data, size)
        code = f"from ctxengine.store import Store\ntry:\n    Store({str(path)!r})\nexcept Exception as e:\n    print(e)"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (size, r.returncode, r.stderr[-500:])
        assert f"data.mdb is truncated: {size:,} bytes" in r.stdout and "restore it from a backup" in r.stdout


def test_an_empty_data_file_is_refused_not_taken_for_a_new_store(tmp_path):
    # LMDB starts a new store on a 0-byte data.mdb: a store truncated to nothing came back empty, in silence.
    path = tmp_path / "s"
    with Store(path) as s:
        s.put_pages([rand_page(random.Random(3))])
    os.truncate(path / "data.mdb", 0)
    with pytest.raises(StoreError, match="data.mdb is empty .* holds no snapshots"):
        Store(path)
    assert (path / "data.mdb").stat().st_size == 0  # nothing written over it


def test_a_write_the_disk_fails_is_the_stores_trouble_and_keeps_nothing(tmp_path):
    # LMDB's commit error on a full disk (EIO, ENOSPC) came up as a plain StoreError, which a
    # server answered as the client's 400 ("mdb_txn_commit: Input/output error").
    from ctxengine.api.errors import status_of
    from ctxengine.errors import StorageError

    rng = random.Random(11)
    with Store(tmp_path / "s") as s:
        real = s.env.env

        class FailingCommit:
            def begin(self, **kw):
                if kw.get("write"):
                    raise lmdb.DiskError("mdb_txn_commit: Input/output error")
                return real.begin(**kw)

            def __getattr__(self, name):
                return getattr(real, name)

        s.env.env = FailingCommit()
        page = rand_page(rng)
        try:
            with pytest.raises(StorageError, match="a write failed, nothing of it kept .* is its disk full"):
                s.put_pages([page])
        finally:
            s.env.env = real
        assert s.missing_pages([page_key(page)]) == [page_key(page)]
    assert status_of(StorageError("x")) == 507


def _fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
        except OSError:
            pass  # ENOSPC: full


def test_a_store_on_a_full_disk_is_an_error_not_a_sigbus(tmp_path):
    # LMDB sizes lock.mdb with ftruncate and writes it through a mapping: on a full tmpfs the
    # process died of SIGBUS, silently (rc 135), making or opening a store.
    import subprocess
    import sys
    full = tmp_path / "full"
    full.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs (a disk to fill) needs root")
    try:
        with Store(full / "kept") as s:  # made while there was room
            s.put_pages([rand_page(random.Random(5))])
        _fill(full)
        for store in (full / "new", full / "kept"):
            r = subprocess.run([sys.executable, "-c", "import sys, ctxengine as ce; ce.Store(sys.argv[1]).close()",
                                str(store)], capture_output=True, text=True, timeout=120)
            if store.name == "new":
                assert r.returncode == 1 and "no room for its lock file" in r.stderr, (r.returncode, r.stderr[-500:])
            else:  # its lock file's bytes were allocated when it was made
                assert r.returncode == 0, r.stderr[-500:]
        os.unlink(full / "filler")
        with Store(full / "new") as s:  # once there is room again
            assert s.missing_pages([]) == []
    finally:
        subprocess.run(["umount", "-l", str(full)], capture_output=True)
