"""A damaged store is refused with a message, never hung on or collected around."""
import json
import os
import random
import shutil
import struct
import subprocess
import sys

import pytest

from ctxengine.errors import CorruptDataError
from ctxengine.store import Manifest, Store, page_key

POOL = [bytes([i]) * 64 + bytes(range(i, i + 8)) for i in range(6)]  # small distinct pages
KEYS = [page_key(p) for p in POOL]


def manifest(page_idx, parent=None) -> Manifest:
    keys = [KEYS[i] for i in page_idx]
    n = len(keys) * 16
    return Manifest(weight_id="w", model_name="m", kv_dtype="f16", page_tokens=16, token_ids=[7] * n,
                    page_keys=keys, page_size=72, n_tokens=n, parent=parent, created=1.0)


def move_record(s: Store, db: str, key: str) -> bytes:
    """Damage the store as one flipped bit in a record's key would: the intact record
    moves to a key nothing names. Returns the damaged key."""
    kb = bytes.fromhex(key)
    bad = bytes([kb[0] ^ 1]) + kb[1:]

    def write(txn):
        record = txn.get(kb, db=s.env.dbs[db])
        txn.delete(kb, db=s.env.dbs[db])
        txn.put(bad, record, db=s.env.dbs[db])

    s.env.write(write)
    return bad


def contents(s: Store) -> tuple[list[str], list[str], dict[str, str]]:
    return sorted(s.snapshots()), sorted(s.page_keys()), s.refs()


def test_store_files_that_are_not_regular_files_are_refused_at_once(tmp_path):
    # A FIFO as data.mdb hung Store() (and `ctx ls`) forever in a blocking open();
    # run in a child so that a hang fails this test instead of the whole suite.
    for name in ("data.mdb", "lock.mdb"):
        (tmp_path / f"fifo-{name}").mkdir()
        os.mkfifo(tmp_path / f"fifo-{name}" / name)
    (tmp_path / "dir-data").mkdir()
    (tmp_path / "dir-data" / "data.mdb").mkdir()
    code = ("import sys\nfrom ctxengine.store import Store\nfor p in sys.argv[1:]:\n"
            "    try:\n        Store(p)\n    except Exception as e:\n        print(type(e).__name__, e)\n")
    cases = ["fifo-data.mdb", "fifo-lock.mdb", "dir-data"]
    r = subprocess.run([sys.executable, "-c", code, *(str(tmp_path / c) for c in cases)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-500:]
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    for line, case, name in zip(lines, cases, ["data.mdb", "lock.mdb", "data.mdb"]):
        assert line.startswith("StoreError ") and f"{case}/{name} is not a regular file" in line, line


def test_gc_refuses_a_ref_whose_manifest_is_missing(tmp_path):
    with Store(tmp_path / "s") as s:
        sid = s.snapshot(manifest([0, 1]), POOL[:2], ref="a")
        s.snapshot(manifest([2]), POOL[2:3])  # garbage, which gc must not collect either
        bad = move_record(s, "manifests", sid)
        before = contents(s)
        with pytest.raises(CorruptDataError, match=f"ref 'a' points at snapshot {sid}.*removed nothing"):
            s.gc(grace=0)
        assert contents(s) == before
        move_record(s, "manifests", bad.hex())  # repaired, the snapshot is whole again
        assert s.gc(grace=0).manifests_removed == 1
        assert s.get_pages(s.get_manifest(s.resolve("a")).page_keys) == POOL[:2]


@pytest.mark.parametrize("damaged", ["child", "parent"])
def test_gc_refuses_a_live_snapshot_whose_page_is_missing(tmp_path, damaged):
    with Store(tmp_path / "s") as s:
        parent = s.snapshot(manifest([0, 1]), POOL[:2])
        child = s.snapshot(manifest([1, 2], parent=parent), POOL[1:3], ref="main")
        s.snapshot(manifest([3]), POOL[3:4])
        owner, key = (child, KEYS[2]) if damaged == "child" else (parent, KEYS[0])
        move_record(s, "pages", key)
        before = contents(s)
        with pytest.raises(CorruptDataError, match=f"snapshot {owner} names page {key}.*removed nothing"):
            s.gc(grace=0)
        assert contents(s) == before


def test_gc_walks_past_a_parent_that_is_not_stored(tmp_path):
    # A parent may legitimately live elsewhere (an imported snapshot), so gc cannot tell
    # a missing parent from a damaged one: it keeps the child and goes on.
    with Store(tmp_path / "s") as s:
        parent = s.snapshot(manifest([0]), POOL[:1])
        child = s.snapshot(manifest([0, 1], parent=parent), POOL[:2], ref="main")
        move_record(s, "manifests", parent)
        r = s.gc(grace=0)
        assert (r.manifests_removed, r.pages_removed, r.manifests_kept) == (1, 0, 1)
        assert s.snapshots() == [child]


def test_gc_of_a_healthy_store_still_collects(tmp_path):
    with Store(tmp_path / "s") as s:
        a = s.snapshot(manifest([0, 1]), POOL[:2], ref="main")
        b = s.snapshot(manifest([1, 2, 1], parent=a), POOL[1:3], ref="main")
        s.snapshot(manifest([4]), POOL[4:5], ref="tmp")
        s.delete_ref("tmp")
        r = s.gc(grace=0)
        assert (r.manifests_removed, r.pages_removed, r.manifests_kept, r.pages_kept) == (1, 1, 2, 3)
        assert sorted(s.snapshots()) == sorted([a, b])


# -- data.mdb damaged in place -------------------------------------------------
# LMDB trusts what is inside a page (node offsets, key and value sizes, page flags): one
# damaged field sent a read past the file's end and killed the process with SIGBUS. Each
# case below damages a copy of a small real store and runs the store's reads and a gc in
# a child process, so that a crash shows as a signal instead of taking pytest down.

BIG = [random.Random(i).randbytes(5000) for i in range(8)]  # random: stored raw, in overflow pages
PSIZE = 4096

CHILD = r"""
import json, shutil, sys
from ctxengine.errors import CtxError
from ctxengine.store import Store
root, cases = sys.argv[1], json.load(sys.stdin)
for name, edits in cases:
    path = f"{root}/{name}"
    shutil.copytree(f"{root}/pristine", path)
    with open(f"{path}/data.mdb", "r+b") as f:
        for off, data in edits:
            f.seek(off)
            f.write(bytes.fromhex(data))
    print("start", name, flush=True)
    try:
        with Store(path) as s:
            refs = s.refs()
            for sid in s.snapshots():
                m = s.get_manifest(sid)
                s.get_pages(m.page_keys)
            s.page_keys()
            s.stats()
            s.gc(grace=0)
            s.put_pages([b"one more page" * 9])
        out = "ok " + json.dumps(refs)
    except CtxError as e:
        out = f"error {type(e).__name__}: {e}"
    except Exception as e:
        out = f"UNCLEAR {type(e).__name__}: {e}"
    print("done", name, out.replace(chr(10), " "), flush=True)
    shutil.rmtree(path, ignore_errors=True)
"""


def big_manifest(idx, parent=None) -> Manifest:
    keys = [page_key(BIG[i]) for i in idx]
    n = len(keys) * 16
    return Manifest(weight_id="w", model_name="m", kv_dtype="f16", page_tokens=16, token_ids=[7] * n,
                    page_keys=keys, page_size=5000, n_tokens=n, parent=parent, created=1.0)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A small real store: overflow pages, several snapshots and refs, a free-page list."""
    root = tmp_path_factory.mktemp("damage")
    with Store(root / "pristine") as s:
        a = s.snapshot(big_manifest([0, 1, 2]), BIG[:3], ref="main")
        b = s.snapshot(big_manifest([2, 3, 4], parent=a), BIG[2:5], ref="main")
        s.snapshot(big_manifest([5]), BIG[5:6], ref="tmp")
        s.snapshot(manifest([0, 1]), POOL[:2], ref="small")
        s.delete_ref("tmp")
        s.gc(grace=0)
        s.snapshot(big_manifest([6, 7], parent=b), BIG[6:8], ref="dev/x")
    return root


def run_cases(root, cases, children: int = 2) -> dict[str, str]:
    """Run (name, [(offset, hex bytes)]) cases in children; a child that dies of a signal
    is recorded against the case it was running and its rest go on in a new child."""
    results: dict[str, str] = {}
    todo = list(cases)
    while todo:
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(root)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in todo[:children]]
        outs = [p.communicate(json.dumps(todo[i::len(procs)]), timeout=300) for i, p in enumerate(procs)]
        for p, (stdout, stderr) in zip(procs, outs):
            started = None
            for line in stdout.splitlines():
                word, name, *rest = line.split(" ", 2)
                if word == "start":
                    started = name
                else:
                    results[name], started = rest[0] if rest else "", None
            if p.returncode < 0 and started is not None:
                results[started] = f"CRASH signal {-p.returncode}: {stderr[-300:]}"
                shutil.rmtree(root / started, ignore_errors=True)
            elif p.returncode != 0:
                raise AssertionError(stderr[-2000:])
        todo = [c for c in todo if c[0] not in results]
    return results


def tree_fields(data: bytes) -> list[tuple[str, int, int]]:
    """(what, offset, width) of every page-number, flag, offset and size field LMDB reads
    in the file's pages (found by reading them as LMDB lays them out, independently of
    ctxengine.store.lmdb_check)."""
    fields = []
    p = 2
    while p < len(data) // PSIZE:
        at = p * PSIZE
        _, _, flags, lower, upper = struct.unpack_from("<QHHHH", data, at)
        fields += [(f"p{p}.pgno", at, 8), (f"p{p}.flags", at + 10, 2)]
        if flags == 4:  # an overflow run: its header, then its pages
            n = struct.unpack_from("<I", data, at + 12)[0]
            fields.append((f"p{p}.pages", at + 12, 4))
            p += max(n, 1)
            continue
        if flags in (1, 2):
            fields += [(f"p{p}.lower", at + 12, 2), (f"p{p}.upper", at + 14, 2)]
            for i in range((lower - 16) // 2):
                ptr = struct.unpack_from("<H", data, at + 16 + 2 * i)[0]
                node = at + ptr
                lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, node)
                fields += [(f"p{p}.ptr{i}", at + 16 + 2 * i, 2), (f"p{p}.n{i}.lo", node, 2),
                           (f"p{p}.n{i}.hi", node + 2, 2), (f"p{p}.n{i}.flags", node + 4, 2),
                           (f"p{p}.n{i}.ksize", node + 6, 2)]
                if flags == 2 and nflags & 1:  # F_BIGDATA: the overflow page number
                    fields.append((f"p{p}.n{i}.ovpg", node + 8 + ksize, 8))
                if flags == 2 and nflags & 2:  # F_SUBDATA: a named database's record
                    db = node + 8 + ksize
                    fields += [(f"p{p}.n{i}.db.flags", db + 4, 2), (f"p{p}.n{i}.db.depth", db + 6, 2),
                               (f"p{p}.n{i}.db.root", db + 40, 8)]
        p += 1
    for m in (0, 1):  # the meta pages' roots, depths and last page
        at = m * PSIZE + 16
        fields += [(f"meta{m}.free.root", at + 24 + 40, 8), (f"meta{m}.main.root", at + 72 + 40, 8),
                   (f"meta{m}.main.depth", at + 72 + 6, 2), (f"meta{m}.last", at + 120, 8)]
    return fields


def damage_cases(data: bytes) -> list:
    cases = []
    for what, off, width in tree_fields(data):
        old = int.from_bytes(data[off:off + width], "little")
        top = (1 << (8 * width)) - 1
        for tag, new in (("big", min(top, 4294967)), ("x1", old ^ 1), ("hi", old ^ (1 << (8 * width - 1))),
                         ("zero", 0)):
            if new != old:
                cases.append((f"{what}.{tag}", [(off, new.to_bytes(width, "little").hex())]))
    rng = random.Random(1234)
    for i in range(200):  # random bit flips anywhere in the tree and overflow pages
        off = rng.randrange(2 * PSIZE, len(data))
        cases.append((f"flip{i}@{off}", [(off, bytes([data[off] ^ (1 << rng.randrange(8))]).hex())]))
    return cases


def test_no_damage_to_data_mdb_kills_the_process(pristine):
    data = (pristine / "pristine" / "data.mdb").read_bytes()
    cases = damage_cases(data)
    assert len(cases) > 600
    results = run_cases(pristine, cases)
    crashed = {k: v for k, v in results.items() if v.startswith("CRASH")}
    unclear = {k: v for k, v in results.items() if v.startswith("UNCLEAR")}
    misread = {k: v for k, v in results.items() if "disk full" in v}  # damage is not the disk's failure
    assert not crashed, f"{len(crashed)} cases killed the process: {list(crashed.items())[:5]}"
    assert not unclear, f"{len(unclear)} cases raised no CtxError: {list(unclear.items())[:5]}"
    assert not misread, f"{len(misread)} cases blamed the disk: {list(misread.items())[:5]}"
    assert len(results) == len(cases)
    store_errors = [v for v in results.values() if v.startswith("error StoreError")]
    assert store_errors and all(str(pristine) in v for v in store_errors[:50])


def _main_leaf(data: bytes) -> tuple[int, int]:
    """The main tree's root page (a leaf in a store this small) and its page count."""
    metas = [struct.unpack_from("<Q", data, m * PSIZE + 16 + 136 + 8)[0] for m in (0, 1)]
    at = (metas[0] < metas[1]) * PSIZE + 16
    root = struct.unpack_from("<Q", data, at + 72 + 40)[0]
    assert struct.unpack_from("<H", data, root * PSIZE + 10)[0] == 2, "the main tree should be one leaf"
    return root, struct.unpack_from("<Q", data, at + 120)[0] + 1


def test_a_named_databases_root_past_the_end_is_a_store_error(pristine):
    data = (pristine / "pristine" / "data.mdb").read_bytes()
    root, npages = _main_leaf(data)
    at = root * PSIZE
    ptr = struct.unpack_from("<H", data, at + 16)[0]  # node 0: the first named database
    ksize = struct.unpack_from("<H", data, at + ptr + 6)[0]
    record = at + ptr + 8 + ksize
    # The probe's case: one bit flipped in the main tree's leaf (node 3's offset), and a root
    # page number past the end of the file.
    cases = [("root", [(record + 40, (4294967).to_bytes(8, "little").hex())]),
             ("probe", [(at + 16 + 2 * 3 + 1, bytes([data[at + 16 + 2 * 3 + 1] ^ 0x20]).hex())])]
    results = run_cases(pristine, cases)
    name = data[at + ptr + 8:at + ptr + 8 + ksize].decode()
    assert results["root"].startswith("error StoreError: ")
    assert f"{pristine}/root/data.mdb: page {root} (database '{name}') names page 4294967 past the file's " \
           f"{npages} pages; the store is damaged" in results["root"], results["root"]
    assert results["probe"].startswith(f"error StoreError: {pristine}/probe/data.mdb: page {root} puts node 3 at "
                                       "offset "), results["probe"]


def test_an_undamaged_store_opens_and_restores_as_before(pristine, tmp_path):
    shutil.copytree(pristine / "pristine", tmp_path / "s")
    with Store(tmp_path / "s") as s:
        m = s.get_manifest(s.resolve("dev/x"))
        assert s.get_pages(m.page_keys) == BIG[6:8]
        assert s.get_pages(s.get_manifest(s.resolve("main")).page_keys) == BIG[2:5]
        assert s.get_pages(s.get_manifest(s.resolve("small")).page_keys) == POOL[:2]
        assert sorted(s.refs()) == ["dev/x", "main", "small"]
    assert run_cases(pristine, [("same", [])])["same"].startswith("ok ")


def test_a_damaged_transaction_id_that_would_roll_the_store_back_is_refused(pristine):
    """LMDB opens the meta page with the higher transaction id. One flipped bit in the
    older page's id made it the newer, and the store opened the transaction before the
    last without a word (a ref pointing at its previous snapshot; found by a probe). The
    two pages must hold consecutive ids, the newer on the page of its parity."""
    data = (pristine / "pristine" / "data.mdb").read_bytes()
    ids = [struct.unpack_from("<Q", data, m * PSIZE + 16 + 128)[0] for m in (0, 1)]
    older = int(ids[0] > ids[1])
    at = older * PSIZE + 16 + 128
    cases = [(f"bit{b}", [(at, (ids[older] ^ (1 << b)).to_bytes(8, "little").hex())]) for b in (0, 2, 20, 63)]
    cases.append(("newer+2", [(at, (max(ids) + 2).to_bytes(8, "little").hex())]))
    results = run_cases(pristine, cases)
    for name, _ in cases:
        assert results[name].startswith("error StoreError: ") and "which no two consecutive commits write" in \
            results[name], (name, results[name])
