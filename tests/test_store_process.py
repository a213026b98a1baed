"""Several processes on one store, and processes killed in the middle of a snapshot."""
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

from ctxengine.store import Manifest, Store, page_key

SMALL = 50_000


def _manifest(keys, parent=None, label="") -> Manifest:
    n = len(keys) * 16
    return Manifest(weight_id="w", model_name="m", kv_dtype="f16", page_tokens=16,
                    token_ids=[1] * n, page_keys=keys, page_size=SMALL, n_tokens=n,
                    parent=parent, labels={"by": label})


def _shared_pages() -> list[bytes]:
    rng = random.Random(0)
    return [rng.randbytes(SMALL) for _ in range(4)]


def _writer(path: str, wid: int, n: int, out) -> None:
    """Spawned: n snapshots on ref w<wid>, each sharing pages with the other writer."""
    try:
        rng = random.Random(100 + wid)
        shared = _shared_pages()
        with Store(path, map_size=64 * 1024) as s:  # tiny: both processes keep growing it
            parent = None
            for i in range(n):
                raws = shared[: 1 + i % 4] + [rng.randbytes(SMALL) for _ in range(3)]
                parent = s.snapshot(_manifest([page_key(r) for r in raws], parent, f"{wid}/{i}"),
                                    raws, ref=f"w{wid}")
        out.put(("ok", "writer", wid))
    except BaseException as e:  # report, do not hang the parent
        out.put(("error", "writer", f"{wid}: {e!r}"))


def _reader(path: str, seconds: float, out) -> None:
    """Spawned: keep reading whatever the refs point at, verifying every page."""
    try:
        reads, deadline = 0, time.monotonic() + seconds
        with Store(path, map_size=64 * 1024) as s:
            while time.monotonic() < deadline:
                for name, sid in s.refs().items():
                    s.resolve(name)  # may already point further on: writers keep going
                    m = s.get_manifest(sid)
                    assert m.snapshot_id() == sid
                    assert all(len(p) == SMALL for p in s.get_pages(m.page_keys))
                    reads += 1
        out.put(("ok", "reader", reads))
    except BaseException as e:
        out.put(("error", "reader", repr(e)))


def test_two_writers_and_a_reader(tmp_path):
    path = str(tmp_path / "s")
    Store(path, map_size=64 * 1024).close()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, w, 12, out)) for w in (0, 1)]
    procs.append(ctx.Process(target=_reader, args=(path, 2.5, out)))
    for p in procs:
        p.start()
    results = [out.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(kind == "ok" for kind, _, _ in results), results
    assert next(n for _, role, n in results if role == "reader") > 0
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with Store(path) as s:
        assert sorted(s.refs()) == ["w0", "w1"]
        assert len(s.snapshots()) == 24
        # 4 shared pages written by both writers are stored once.
        assert len(s.page_keys()) == 4 + 2 * 12 * 3
        for name in ("w0", "w1"):
            assert len(s.ref_log(name)) == 12
        assert s.stats().dedup_ratio > 1.0


# The victim: keeps writing big snapshots (12 pages x 368 KB) on ref "main",
# printing each id once committed, until it is killed.
CHILD = textwrap.dedent("""
    import random, sys
    from ctxengine.store import Manifest, Store, page_key
    path, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    s = Store(path, map_size=1 << 20)
    parent = s.resolve("main")
    print("ready", flush=True)
    i = 0
    while True:
        raws = [rng.randbytes(368 * 1024) for _ in range(12)]
        keys = [page_key(r) for r in raws]
        m = Manifest(weight_id="w", model_name="m", kv_dtype="f16", page_tokens=16,
                     token_ids=[i] * 192, page_keys=keys, page_size=368 * 1024,
                     n_tokens=192, parent=parent)
        parent = s.snapshot(m, raws, ref="main")
        print(parent, flush=True)
        i += 1
""")


def test_sigkill_mid_snapshot_leaves_store_consistent(tmp_path):
    rng = random.Random(42)
    base_page = b"base" * 1000
    for trial in range(6):
        path = tmp_path / f"t{trial}"
        with Store(path) as s:
            base = s.snapshot(_manifest([page_key(base_page)]), [base_page], ref="base")
            s.set_ref("main", base)
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(trial)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            time.sleep(rng.uniform(0.02, 0.35))
            os.kill(child.pid, signal.SIGKILL)
            rest, err = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL, err
        committed = rest.split()

        with Store(path) as s:
            assert s.refs()["base"] == base
            assert s.get_manifest(base).page_keys == [page_key(base_page)]
            ids = set(s.snapshots())
            assert set(committed) <= ids
            # At most one snapshot committed after its id was last printed.
            assert len(ids) - 1 - len(committed) in (0, 1)
            main = s.resolve("main")
            assert main in ids and (not committed or main in (committed[-1], *ids - set(committed)))
            # main's history walks back to base, and every log entry names a stored snapshot.
            sid, chain = main, 0
            while sid != base:
                sid = s.get_manifest(sid).parent
                chain += 1
            assert chain == len(ids) - 1
            assert all(e.new in ids for e in s.ref_log("main"))
            # Every manifest's pages are present and intact, and no page is orphaned:
            # pages and manifest commit together or not at all.
            named = set()
            for sid in ids:
                m = s.get_manifest(sid)
                s.get_pages(m.page_keys)
                named.update(m.page_keys)
            assert set(s.page_keys()) == named
        shutil.rmtree(path)
