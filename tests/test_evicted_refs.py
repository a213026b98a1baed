"""`ctx gc` drops the eviction refs of a process that died, and never a live one's."""
import os
import signal
import subprocess
import sys
import textwrap

from ctxengine.state.evicted import EVICTED_REF_PREFIX, owner_alive, owner_tag
from ctxengine.store import Store

# A process whose page pool (16 pages) holds five 3-page contexts: the sixth evicts the first.
CHILD = textwrap.dedent("""
    import sys, ctxengine as ce
    from ctxengine.engine.engine import Engine
    probe = Engine(sys.argv[1], threads=1)
    page_bytes = probe.pool.page_bytes
    probe.close()
    model = ce.Model(Engine(sys.argv[1], threads=1, kv_budget=16 * page_bytes))
    model.contexts.store = ce.Store(sys.argv[2])
    ids = model.tokenize("The history of the printing press begins in the fifteenth century. " * 4)[:40]
    cs = []
    for i in range(6):
        c = model.context(f"c{i}")
        c.append([(t + i) % model.config.n_vocab for t in ids])
        cs.append(c)
    assert model.contexts.n_evictions >= 1
    print("EVICTED", flush=True)
    sys.stdin.read()  # until killed
""")


def ctx_gc(store_path):
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "gc", "--store", str(store_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def evicted_refs(path) -> dict:
    with Store(path) as s:
        return {n: sid for n, sid in s.refs().items() if n.startswith(EVICTED_REF_PREFIX + "/")}


def test_gc_keeps_a_live_owners_refs_and_drops_them_once_it_is_killed(smollm2_path, tmp_path):
    path = tmp_path / "store"
    with subprocess.Popen([sys.executable, "-c", CHILD, str(smollm2_path), str(path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            assert p.stdout.readline().strip() == "EVICTED", p.stderr.read()
            refs = evicted_refs(path)
            assert refs and all(n.split("/")[1].startswith(f"{p.pid}-") for n in refs), refs
            r = ctx_gc(path)  # the owner runs: its evicted contexts may still come back
            assert "dropped" not in r.stderr and evicted_refs(path) == refs
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == -signal.SIGKILL
    assert evicted_refs(path) == refs  # the dead process could not drop them itself
    r = ctx_gc(path)
    assert f"dropped {len(refs)} refs" in r.stderr
    assert evicted_refs(path) == {}
    with Store(path) as s:
        assert s.snapshots() == [] and s.stats().n_pages == 0  # nothing else pinned their pages
    assert f"removed {len(set(refs.values()))} snapshots" in r.stdout


def test_an_owner_is_its_pid_and_start_time_in_its_pid_namespace():
    me = owner_tag()
    pid, start, ns = (int(x) for x in me.split("-"))
    assert pid == os.getpid() and ns == os.stat("/proc/self/ns/pid").st_ino and owner_alive(f"{me}-1")
    assert not owner_alive(f"{pid}-{start + 1}-{ns}-1")  # the same id, another process: the owner is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not owner_alive(f"{int(dead.stdout)}-{start}-{ns}-1")
    # Another PID namespace's process (a container on the same store) cannot be seen from here:
    # its refs were dropped by a gc outside it, and its evicted contexts lost.
    assert owner_alive(f"{int(dead.stdout)}-{start}-{ns + 1}-1") and owner_alive(f"{pid}-{start + 1}-0-1")
    assert not owner_alive(f"{pid}-{start + 1}-1")  # written before namespaces were: judged as then
    assert owner_alive(f"{pid}-1")  # an older ref without a start time: kept while the id runs
    assert owner_alive("someone-else")  # not a name this table writes: left alone
