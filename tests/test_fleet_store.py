"""The fleet tier of the store (ctxengine/store/fleet*.py) against a real
3-master, 3-replica Redis Cluster: what crosses, refs by compare-and-set,
gc, a refused eviction policy, an unreachable fleet, and a master killed
mid-snapshot."""
from __future__ import annotations

import threading
import time

import pytest

import ctxengine as ce
from ctxengine.errors import RefConflictError, RefDeletedError, StoreError
from ctxengine.store.fleet_cluster import FleetError
from redis_cluster import NODE_TIMEOUT_MS, RedisCluster, fleet, redis_cluster  # noqa: F401 (fixtures)
from servers import ctx, free_port

FAILOVER_S = 2.5 * NODE_TIMEOUT_MS / 1000   # node timeout, then the election: a bound, not a target
TEXT = "Tide pools hold anemones, crabs and small fish between the rocks. "


@pytest.fixture(scope="module")
def shared_model():
    m = ce.load("smollm2", threads=2)
    yield m
    m.close()


@pytest.fixture
def model(shared_model):
    """The module's model, its contexts deleted after each test."""
    yield shared_model
    for name in shared_model.contexts.names():
        shared_model.contexts.remove(name)


def tokens(model, n: int) -> list[int]:
    return (model.tokenize(TEXT) * (n // 8 + 1))[:n]


def greedy(ctx, n: int = 8) -> list[int]:
    return [p.token_id for p in ctx.generate(max_tokens=n, temperature=0.0)]


def test_only_missing_pages_cross_and_restores_are_bit_identical(model, fleet, tmp_path):
    a = ce.Store(tmp_path / "a", fleet=fleet.url, host_id="a")
    b = ce.Store(tmp_path / "b", fleet=fleet.url, host_id="b")
    with a, b:
        trunk = model.context("trunk")
        trunk.append(tokens(model, 160))            # 10 full pages
        trunk.snapshot(a, ref="trunk")
        assert a.fleet.stats().pages_sent == 10 == len(fleet.keys("ctx:p:*"))
        branch = trunk.fork("branch")
        branch.append(tokens(model, 20)[::-1])      # 1 page and a partial one of its own
        branch.snapshot(a, ref="branch")
        assert a.fleet.stats().pages_sent == 12 == len(fleet.keys("ctx:p:*"))

        expected = greedy(branch)
        restored = model.restore(b, "branch", name="on-b")  # B's store is empty: all from the fleet
        assert greedy(restored) == expected
        assert b.fleet.stats().pages_fetched == 12
        again = model.restore(b, "trunk", name="trunk-on-b")  # its pages are local now
        assert b.fleet.stats().pages_fetched == 12 and again.n_tokens == 160
        # B's next snapshot of the restored branch sends only its new pages
        restored.snapshot(b, ref="branch")
        assert b.fleet.stats().pages_sent == 1  # the partial page the 8 new tokens changed
        assert a.resolve("branch") == restored.snapshot_id  # A sees where B moved it


def test_concurrent_ref_moves_one_wins_the_other_conflicts(model, fleet, tmp_path):
    a = ce.Store(tmp_path / "a", fleet=fleet.url, host_id="a")
    b = ce.Store(tmp_path / "b", fleet=fleet.url, host_id="b")
    with a, b:
        base = model.context("base")
        base.append(tokens(model, 40))
        base.snapshot(a, ref="shared")
        on_a = model.restore(a, "shared", name="on-a")
        on_b = model.restore(b, "shared", name="on-b")
        on_a.append(tokens(model, 5))
        on_b.append(tokens(model, 7))
        results: dict[str, object] = {}
        go = threading.Barrier(2)

        def move(name, ctx, store):
            go.wait()
            try:
                results[name] = ctx.snapshot(store, ref="shared")
            except RefConflictError as e:
                results[name] = e

        threads = [threading.Thread(target=move, args=(n, c, s)) for n, c, s in
                   (("a", on_a, a), ("b", on_b, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, r in results.items() if isinstance(r, str)]
        losers = [n for n, r in results.items() if isinstance(r, RefConflictError)]
        assert len(winners) == 1 and len(losers) == 1, results
        err = results[losers[0]]
        assert "ref 'shared' was moved on the fleet" in str(err) and "\n" not in str(err)
        assert a.resolve("shared") == b.resolve("shared") == results[winners[0]]
        log = a.fleet.ref_log("shared")
        assert [e["host"] for e in log] == ["a", winners[0]]  # no lost write, no phantom one
        # the loser continues from the winner's state and then moves the ref forward
        loser_store = a if losers[0] == "a" else b
        fresh = model.restore(loser_store, "shared", name="fresh")
        fresh.append(tokens(model, 3))
        assert fresh.snapshot(loser_store, ref="shared") == a.resolve("shared")


def test_a_ref_deleted_while_a_host_continues_it_is_not_made_again(model, fleet, tmp_path):
    # Host b's snapshot continuing the deleted state found the ref absent and moved it:
    # the conversation deleted on host a came back under its name.
    a = ce.Store(tmp_path / "a", fleet=fleet.url, host_id="a")
    b = ce.Store(tmp_path / "b", fleet=fleet.url, host_id="b")
    with a, b:
        talk = model.context("talk")
        talk.append(tokens(model, 40))
        talk.snapshot(a, ref="talk")
        on_b = model.restore(b, "talk", name="talk-on-b")
        on_b.append(tokens(model, 5))
        assert a.fleet.delete_ref("talk")
        with pytest.raises(RefDeletedError, match=r"ref 'talk' was deleted on the fleet by host a while snapshot"):
            on_b.snapshot(b, ref="talk")
        assert b.fleet.get_ref("talk") is None and b.fleet.deleted("talk")
        on_b.append(tokens(model, 3))  # nor later: the whole history descends from the deleted state
        with pytest.raises(RefDeletedError):
            on_b.snapshot(b, ref="talk")
        # A snapshot of another history may take the name (and clears the tombstone).
        other = model.context("other")
        other.append(tokens(model, 9)[::-1])
        sid = other.snapshot(b, ref="talk")
        assert a.fleet.get_ref("talk") == sid and not a.fleet.deleted("talk")


def test_fleet_gc_keeps_what_refs_reach_and_publishes_in_grace(model, fleet, tmp_path):
    with ce.Store(tmp_path / "a", fleet=fleet.url, host_id="a") as a:
        kept = model.context("kept")
        kept.append(tokens(model, 48))
        kept.snapshot(a, ref="kept")
        child = kept.fork("child")
        child.append(tokens(model, 32)[::-1])
        child.snapshot(a, ref="child")
        parent_id = a.resolve("kept")
        a.delete_ref("child")
        assert a.fleet.gc().manifests_removed == 0  # within the grace period nothing goes
        r = a.fleet.gc(grace=0)
        assert r.manifests_removed == 1 and r.pages_removed == 2 and r.bytes_freed > 0
        assert len(fleet.keys("ctx:m:*")) == 1 and len(fleet.keys("ctx:p:*")) == 3
        kept.append(tokens(model, 20))
        kept.snapshot(a, ref="kept")
        r = a.fleet.gc(grace=0)
        assert r.manifests_removed == 0  # the old snapshot is the new one's parent: a root's history
        assert a.fleet.get_manifest(parent_id) is not None
        a.delete_ref("kept")
    out = ctx("gc", "--fleet", fleet.url, "--grace", "0", "--store", tmp_path / "cli", home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("removed 2 snapshots and 5 pages")
    # Nothing is left but the deleted refs' tombstones, which expire on their own (fleet_refs.py).
    assert sorted(fleet.keys("ctx:*")) == ["ctx:rx:{child}", "ctx:rx:{kept}"]


def test_a_cluster_that_may_evict_is_refused(tmp_path):
    cluster = RedisCluster(tmp_path / "redis", policy="allkeys-lru")
    try:
        with pytest.raises(FleetError, match="maxmemory-policy allkeys-lru, which may evict"):
            ce.Store(tmp_path / "s", fleet=cluster.url)
    finally:
        cluster.stop()


def test_an_unreachable_fleet_degrades_to_local_with_one_warning(model, tmp_path, capfd):
    url = f"redis://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with ce.Store(tmp_path / "s", fleet=url) as store:
        ctx = model.context("alone")
        ctx.append(tokens(model, 20))
        sid = ctx.snapshot(store, ref="alone")
        ctx.snapshot(store, ref="alone")
        assert store.resolve("alone") != sid and store.fleet.online is False
        assert greedy(model.restore(store, "alone", name="back")) == greedy(ctx)
    assert time.monotonic() - t0 < 30  # seconds of connect timeouts at most, not a hang
    err = capfd.readouterr().err
    assert err.count("warning: fleet") == 1 and "working from the local store only" in err


def test_a_master_killed_mid_snapshot_loses_nothing_a_caller_saw_published(model, tmp_path, capfd):
    cluster = RedisCluster(tmp_path / "redis")
    try:
        with ce.Store(tmp_path / "s", fleet=cluster.url, host_id="a") as store:
            ctx = model.context("killed")
            ctx.append(tokens(model, 64))
            published, local_only, errors = {}, [], []
            stop = threading.Event()

            def snapshots():
                i = 0
                while not stop.is_set() and not errors:
                    ctx.append(tokens(model, 40)[i % 7:][:17])  # new pages every time
                    try:
                        sid = ctx.snapshot(store, ref=f"k/{i}")
                    except StoreError as e:
                        errors.append(e)
                    else:  # what the caller is told: on the fleet (replica-acknowledged), or not
                        (published.__setitem__(f"k/{i}", sid) if store.fleet.holds(sid, f"k/{i}")
                         else local_only.append(f"k/{i}"))
                    i += 1

            worker = threading.Thread(target=snapshots)
            worker.start()
            try:
                while len(published) < 2 and not errors:
                    time.sleep(0.05)
                victim = cluster.masters()[0]
                cluster.kill(victim)                 # while snapshots keep being published
                cluster.wait_failover(victim)
                time.sleep(0.5)
            finally:
                stop.set()
                worker.join()
            assert not errors, errors
            assert store.fleet.stats().retries > 0   # a publish did meet the dead master
            assert not local_only, local_only        # retried through the failover, never local-only
            # A publish started after the promotion goes to the promoted replica at once.
            ctx.append(tokens(model, 20))
            t0 = time.monotonic()
            sid = ctx.snapshot(store, ref="after")
            assert store.fleet.holds(sid, "after") and time.monotonic() - t0 < FAILOVER_S
            published["after"] = sid
        assert "warning: fleet" not in capfd.readouterr().err
        # a fresh reader: every snapshot a caller saw published is there, whole
        with ce.Store(tmp_path / "reader", fleet=cluster.url) as reader:
            refs = reader.fleet.refs()
            lost = {name: (sid, refs.get(name)) for name, sid in published.items() if refs.get(name) != sid}
            assert not lost and set(refs) == set(published), (lost, sorted(refs))
            for sid in {k[len("ctx:m:"):] for k in cluster.keys("ctx:m:*")}:
                m = reader.get_manifest(sid)
                assert not reader.fleet.missing_pages(m.page_keys), f"snapshot {sid} is half there"
            last = model.restore(reader, refs["after"], name="last")
            assert last.tokens == ctx.tokens
    finally:
        cluster.stop()
