"""A transfer moves an existing ref only forward (docs/grpc.md): a push to a real
`ctx serve` may move the server's ref to a snapshot that descends from where it
points, never elsewhere without force (it would silently replace what the ref
held, such as the server's own conversation); the same for SetRef, and for a
pull into a local store. Creating a ref is always allowed."""
import pytest

from ctxengine.rpc import Remote, RemoteError
from ctxengine.rpc.v1 import snapshot_pb2 as pb
from ctxengine.store import Store
from redis_cluster import redis_cluster  # noqa: F401 (fixture)
from servers import CtxServer, ctx, two_hosts

TEXT = "The history of the printing press begins in the fifteenth century with Gutenberg. "
OTHER = "Rivers carve valleys over millions of years, carrying sediment to the sea. "


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """a: where snapshots are made (its store is the local one pushes read); b: the receiver."""
    with two_hosts(tmp_path_factory.mktemp("ref-moves")) as pair:
        yield pair


@pytest.fixture(scope="module")
def ra(hosts):
    with Remote(hosts[0].target) as r:
        yield r


@pytest.fixture(scope="module")
def rb(hosts):
    with Remote(hosts[1].target) as r:
        yield r


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def _chain(remote, name, n, text=TEXT):
    """A context ``name`` snapshotted ``n`` times (each the parent of the next): their ids."""
    c = remote.create(name)
    sids = []
    for i in range(n):
        c.append(f"{text} ({i})")
        sids.append(c.snapshot(ref=name))
    return sids


def _state(store_dir):
    with Store(store_dir) as s:
        return set(s.page_keys()), set(s.snapshots()), s.refs()


def _refused(call) -> RemoteError:
    with pytest.raises(RemoteError) as e:
        call()
    assert e.value.code.name == "FAILED_PRECONDITION", e.value
    return e.value


def test_a_push_that_continues_the_servers_ref_moves_it(hosts, ra, rb, home):
    a, b = hosts
    s1, s2 = _chain(ra, "ff", 2)
    with Store(a.store) as sa:
        rb.push(sa, s1, as_ref="ff")  # the server's "ff" is at s1
        assert rb.push(sa, "ff").ref == "ff"  # s2's parent is s1: forward
    assert rb.refs()["ff"] == s2
    r = ctx("push", "ff", b.target, "--store", a.store, home=home)  # where it already is
    assert r.returncode == 0, r.stderr
    assert rb.refs()["ff"] == s2


def test_a_forward_push_past_snapshots_the_server_never_got_moves_it(hosts, ra, rb, home):
    """One snapshot per turn here; the server has the first only: the client names those between."""
    a, b = hosts
    sids = _chain(ra, "turns", 4)
    with Store(a.store) as sa:
        rb.push(sa, sids[0], as_ref="turns")
    r = ctx("push", "turns", b.target, "--store", a.store, home=home)
    assert r.returncode == 0, r.stderr
    assert rb.refs()["turns"] == sids[3]
    assert not {sids[1], sids[2]} & _state(b.store)[1]  # it never had them, and needs none


def test_a_client_that_names_no_ancestors_moves_only_as_far_as_the_server_can_see(hosts, ra, rb):
    """An older client sends neither force nor ancestors: the server follows its own manifests."""
    a, b = hosts
    s1, s2, s3 = _chain(ra, "old-client", 3)
    with Store(a.store) as sa:
        rb.push(sa, s1, as_ref="old-client")
        rb.push(sa, s3)  # by id: its pages and manifest, no ref
        data = sa.get_manifest(s3).canonical_bytes()
    put = pb.PutManifestRequest(manifest=data, ref="old-client", snapshot_id=s3)
    err = _refused(lambda: rb.unary("snapshots", "PutManifest", put))  # s2 is not there: cannot tell
    assert "'old-client'" in err.details and s1[:12] in err.details
    assert rb.refs()["old-client"] == s1
    with Store(a.store) as sa:
        rb.push(sa, s2)  # now the server has s3's parent, whose parent is s1
    rb.unary("snapshots", "PutManifest", put)
    assert rb.refs()["old-client"] == s3


def test_a_push_that_does_not_continue_the_servers_ref_is_refused_unless_forced(hosts, ra, rb, home):
    a, b = hosts
    live = rb.create("notes")  # the server's own conversation, under the ref it restores from
    live.append(OTHER)
    theirs = live.snapshot(ref="notes")
    (ours,) = _chain(ra, "notes", 1)
    before = _state(b.store)
    r = ctx("push", "notes", b.target, "--store", a.store, home=home)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ctx push: error: ") and "FAILED_PRECONDITION" in r.stderr
    for words in ("'notes'", theirs[:12], ours[:12], "does not continue", "--force", "--as NAME"):
        assert words in r.stderr, (words, r.stderr)
    pages, snapshots, refs = _state(b.store)
    assert (snapshots, refs) == before[1:] and refs["notes"] == theirs  # only pages came
    assert pages >= before[0]
    with Store(a.store) as sa:  # the Python client: the same refusal
        assert "does not continue" in _refused(lambda: rb.push(sa, "notes")).details
    assert _state(b.store)[1:] == before[1:]
    assert rb.restore("notes", name="notes-again").snapshot_id == theirs  # what an eviction would restore
    r = ctx("push", "notes", b.target, "--store", a.store, "--as", "notes-from-a", home=home)
    assert r.returncode == 0, r.stderr
    r = ctx("push", "notes", b.target, "--store", a.store, "--force", home=home)
    assert r.returncode == 0, r.stderr
    refs = rb.refs()
    assert refs["notes"] == ours and refs["notes-from-a"] == ours


def test_a_push_backwards_is_refused_and_force_moves_it(hosts, ra, rb):
    a, b = hosts
    s1, s2 = _chain(ra, "back", 2)
    with Store(a.store) as sa:
        rb.push(sa, "back")
        _refused(lambda: rb.push(sa, s1, as_ref="back"))  # s1 is s2's parent, not its child
        assert rb.refs()["back"] == s2
        assert rb.push(sa, s1, as_ref="back", force=True).ref == "back"
    assert rb.refs()["back"] == s1


def test_a_push_to_a_new_name_creates_it(hosts, ra, rb, home):
    a, b = hosts
    (sid,) = _chain(ra, "fresh", 1)
    assert "fresh" not in rb.refs()
    r = ctx("push", "fresh", b.target, "--store", a.store, home=home)
    assert r.returncode == 0, r.stderr
    assert rb.refs()["fresh"] == sid


def _set_ref(rb, name, sid, force=False):
    return rb.unary("snapshots", "SetRef", pb.SetRefRequest(name=name, snapshot_id=sid, force=force))


def test_set_ref_moves_only_forward_unless_forced(hosts, ra, rb):
    a, b = hosts
    s1, s2 = _chain(ra, "setref", 2)
    (other,) = _chain(ra, "setref-other", 1, OTHER)
    with Store(a.store) as sa:
        for sid in (s1, s2, other):
            rb.push(sa, sid)  # stored there, no ref
    _set_ref(rb, "setref", s1)  # new: created
    _set_ref(rb, "setref", s2)  # forward
    _set_ref(rb, "setref", s2)  # where it is
    before = _state(b.store)
    for sid in (s1, other):  # backwards, sideways
        err = _refused(lambda: _set_ref(rb, "setref", sid))
        assert "'setref'" in err.details and s2[:12] in err.details and "force" in err.details
    assert _state(b.store) == before
    _set_ref(rb, "setref", other, force=True)
    assert rb.refs()["setref"] == other
    # the checks that came before still come first
    for sid, code in (("zz", "INVALID_ARGUMENT"), ("0" * 64, "NOT_FOUND")):
        with pytest.raises(RemoteError) as e:
            _set_ref(rb, "setref", sid)
        assert e.value.code.name == code


def test_pull_moves_a_local_ref_only_forward_unless_forced(hosts, rb, tmp_path, home):
    a, b = hosts
    local = tmp_path / "local"
    sids = _chain(rb, "pulled", 3)
    r = ctx("pull", b.target, sids[0], "--as", "pulled", "--store", local, home=home)
    assert r.returncode == 0, r.stderr
    r = ctx("pull", b.target, "pulled", "--store", local, home=home)  # the host's is two turns on
    assert r.returncode == 0, r.stderr
    assert _state(local)[2] == {"pulled": sids[2]}
    (other,) = _chain(rb, "pulled-other", 1, OTHER)
    before = _state(local)
    r = ctx("pull", b.target, "pulled-other", "--as", "pulled", "--store", local, home=home)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for words in ("'pulled'", sids[2][:12], other[:12], "does not continue", "--force", "nothing was fetched"):
        assert words in r.stderr, (words, r.stderr)
    assert _state(local) == before  # not a page
    r = ctx("pull", b.target, "pulled-other", "--as", "pulled", "--store", local, "--force", home=home)
    assert r.returncode == 0, r.stderr
    assert _state(local)[2] == {"pulled": other}


@pytest.fixture(scope="module")
def fleet_host(tmp_path_factory, redis_cluster):  # noqa: F811 (the session's cluster)
    """A `ctx serve --fleet` on the session's Redis Cluster (docs/fleet.md)."""
    host = CtxServer(tmp_path_factory.mktemp("ref-moves-fleet"), "--fleet", redis_cluster.url,
                     env={"CTX_HOST_ID": "f"})
    yield host
    host.stop()


def test_on_a_fleet_refs_move_forward_and_force_does_not_move_them_back(hosts, fleet_host, ra):
    """The fleet's refs move by its own compare-and-set with ancestry; the server refuses the
    same moves before anything is written, and force too, which the fleet would not allow."""
    a = hosts[0]
    s1, s2 = _chain(ra, "fleet-ref", 2)
    (other,) = _chain(ra, "fleet-other", 1, OTHER)
    with Remote(fleet_host.target) as rf, Store(a.store) as sa:
        rf.push(sa, s1, as_ref="fleet-ref")  # created
        rf.push(sa, "fleet-ref")  # forward
        assert rf.refs()["fleet-ref"] == s2
        for force in (False, True):
            err = _refused(lambda: rf.push(sa, other, as_ref="fleet-ref", force=force))
            assert "'fleet-ref'" in err.details and s2[:12] in err.details, err.details
        assert "fleet" in err.details and "not even --force" in err.details
        assert rf.refs()["fleet-ref"] == s2
        rf.push(sa, other, as_ref="fleet-other")
        assert rf.refs()["fleet-other"] == other


def test_on_a_fleet_a_forward_push_past_snapshots_it_lacks_names_them(hosts, fleet_host, ra):
    """The fleet follows only the manifests it holds: the server says which to push first,
    rather than leave the fleet to refuse with a conflict that never happened."""
    a = hosts[0]
    sids = _chain(ra, "fleet-turns", 4)
    with Remote(fleet_host.target) as rf, Store(a.store) as sa:
        rf.push(sa, sids[0], as_ref="fleet-turns")
        err = _refused(lambda: rf.push(sa, "fleet-turns"))
        assert "lacks 2 in between" in err.details and f"{sids[1][:12]}, {sids[2][:12]}" in err.details, err
        assert rf.refs()["fleet-turns"] == sids[0]
        with Store(fleet_host.store) as sf:
            assert sf.refs()["fleet-turns"] == sids[0]  # its own copy too
        for sid in sids[1:3]:
            rf.push(sa, sid)  # by id: no ref
        rf.push(sa, "fleet-turns")
        assert rf.refs()["fleet-turns"] == sids[3]
