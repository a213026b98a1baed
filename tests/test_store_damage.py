"""A damaged store is refused with a message, never hung on or collected around."""
import os
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
