"""Garbage collection: exactly the unreachable snapshots and pages go."""
import random
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st

from ctxengine.store import Manifest, Store, page_key

POOL = [bytes([i]) * 64 + bytes(range(i, i + 8)) for i in range(8)]  # small distinct pages
KEYS = [page_key(p) for p in POOL]
REFS = ["main", "dev/a", "dev/b"]


def manifest(page_idx, parent=None, label="") -> Manifest:
    keys = [KEYS[i] for i in page_idx]
    n = len(keys) * 16
    return Manifest(weight_id="w", model_name="m", kv_dtype="f16", page_tokens=16,
                    token_ids=[7] * n, page_keys=keys, page_size=72, n_tokens=n,
                    parent=parent, created=1.0, labels={"l": label})


def test_gc_keeps_refs_and_parent_chains(tmp_path):
    with Store(tmp_path / "s") as s:
        a = s.snapshot(manifest([0, 1]), POOL[:2], ref="main")
        b = s.snapshot(manifest([0, 1, 2], parent=a), POOL[:3], ref="main")
        c = s.snapshot(manifest([3]), POOL[3:4], ref="tmp")
        orphan = s.snapshot(manifest([4, 0]), [POOL[4], POOL[0]])
        seen = []
        r = s.gc(progress=lambda done, total: seen.append((done, total)))
        assert (r.manifests_removed, r.pages_removed) == (1, 1)  # orphan and page 4
        assert seen[-1] == (seen[-1][1], seen[-1][1]) and seen[-1][1] == 4 + 5
        assert sorted(s.snapshots()) == sorted([a, b, c])
        s.delete_ref("tmp")
        r = s.gc()
        assert (r.manifests_removed, r.pages_removed, r.manifests_kept, r.pages_kept) == (1, 1, 2, 3)
        assert 0 < r.bytes_freed < 72  # the page compressed
        assert sorted(s.page_keys()) == sorted(KEYS[:3])
        assert s.resolve("main") == b and s.get_manifest(a).page_keys == KEYS[:2]
        assert s.ref_log("main")[0].new == a
        assert orphan not in s.snapshots()


def test_gc_spares_pages_awaiting_their_manifest(tmp_path):
    with Store(tmp_path / "s") as s:
        # A transfer: pages first, manifest last; a gc in between must not eat the pages.
        for i in (0, 1):
            s.put_page(KEYS[i], POOL[i])
        s.put_pages([POOL[2]])
        assert s.gc().pages_removed == 0
        sid = s.put_manifest(manifest([0, 1]))
        s.set_ref("main", sid)
        # Once named by a manifest the grace no longer applies to 0 and 1; page 2 keeps
        # its grace until it runs out.
        assert s.gc().pages_removed == 0
        assert s.gc(grace=0).pages_removed == 1
        assert sorted(s.page_keys()) == sorted(KEYS[:2])
        # A page already stored, but only for a snapshot gc will collect, is
        # protected as well when it is put again ahead of a new manifest.
        s.snapshot(manifest([5]), [POOL[5]])
        assert s.put_pages([POOL[5]]) == [KEYS[5]]
        r = s.gc()
        assert (r.manifests_removed, r.pages_removed) == (1, 0)
        s.set_ref("later", s.put_manifest(manifest([5, 0])))
        assert s.gc(grace=0).pages_removed == 0


def test_gc_parent_outside_store(tmp_path):
    with Store(tmp_path / "s") as s:
        s.snapshot(manifest([0], parent="ab" * 32), POOL[:1], ref="main")
        assert s.gc().manifests_removed == 0


ops = st.lists(
    st.one_of(
        st.tuples(st.just("snap"), st.lists(st.integers(0, len(POOL) - 1), max_size=4),
                  st.sampled_from(REFS + [None]), st.booleans(), st.integers(0, 3)),
        st.tuples(st.just("move"), st.sampled_from(REFS), st.integers(0, 50)),
        st.tuples(st.just("delete"), st.sampled_from(REFS)),
        st.tuples(st.just("gc")),
    ),
    max_size=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_gc_property_never_loses_reachable(ops):
    """Model: manifests {sid: (pages, parent)}, refs {name: sid}. After every step
    each ref reaches only readable manifests and pages; after gc the store holds
    exactly the reachable closure."""
    with tempfile.TemporaryDirectory() as d, Store(d) as s:
        manifests: dict[str, tuple[list[str], str | None]] = {}
        refs: dict[str, str] = {}

        def reachable():
            live, stack = set(), list(refs.values())
            while stack:
                sid = stack.pop()
                if sid in manifests and sid not in live:
                    live.add(sid)
                    stack.append(manifests[sid][1])
            return live

        for op in ops:
            if op[0] == "snap":
                _, idx, ref, with_parent, label = op
                parent = refs.get(ref) if with_parent and ref else None
                m = manifest(idx, parent=parent, label=str(label))
                sid = s.snapshot(m, [POOL[i] for i in idx], ref=ref)
                manifests[sid] = (m.page_keys, parent)
                if ref:
                    refs[ref] = sid
            elif op[0] == "move" and manifests:
                sid = sorted(manifests)[op[2] % len(manifests)]
                s.set_ref(op[1], sid)
                refs[op[1]] = sid
            elif op[0] == "delete" and op[1] in refs:
                s.delete_ref(op[1])
                del refs[op[1]]
            elif op[0] == "gc":
                s.gc()
                live = reachable()
                manifests = {k: v for k, v in manifests.items() if k in live}
                assert set(s.snapshots()) == live
                assert set(s.page_keys()) == {k for sid in live for k in manifests[sid][0]}
            assert s.refs() == refs
            for sid in reachable():
                m = s.get_manifest(sid)
                assert s.get_pages(m.page_keys) == [POOL[KEYS.index(k)] for k in m.page_keys]


def test_stats_after_gc(tmp_path):
    rng = random.Random(5)
    big = [rng.randbytes(10_000) for _ in range(3)]
    with Store(tmp_path / "s") as s:
        s.snapshot(manifest([0]), POOL[:1])  # unreferenced
        keys = [page_key(b) for b in big]
        m = Manifest(weight_id="w", model_name="m", kv_dtype="f16", page_tokens=1,
                     token_ids=[1, 2, 3, 4], page_keys=keys + keys[:1], page_size=10_000, n_tokens=4)
        s.snapshot(m, big, ref="main")
        s.gc()
        st_ = s.stats()
        assert (st_.n_pages, st_.n_manifests, st_.n_refs) == (3, 1, 1)
        assert st_.logical_bytes == 40_000 and st_.unique_raw_bytes == 30_000
        assert abs(st_.dedup_ratio - 4 / 3) < 1e-9
        assert st_.file_bytes > 0
