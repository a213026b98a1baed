"""A fleet whose Redis holds what ctx never wrote there, refuses commands, or
stops answering (docs/fleet.md): a bad record is left out of a listing or
reported as the server's trouble (500, 503), never as the client's (400) or a
crash; a frozen cluster costs at most the retry deadline, once; a conflict's
409 is not retried by the clients; a host id that could not be sent in a
header is refused at start."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest
import redis

import ctxengine as ce
from ctxengine.api.errors import ApiError, as_api_error
from ctxengine.errors import CorruptDataError, InvalidNameError
from ctxengine.store import Manifest, page_key
from ctxengine.store.fleet_cluster import RETRY_DEADLINE_S, FleetCorrupt, FleetError, FleetUnavailable
from ctxengine.store.names import default_host_id, validate_host_id
from redis_cluster import RedisCluster, fleet, redis_cluster  # noqa: F401 (fixtures)
from servers import CtxServer, ctx, free_port

SYSTEM = "You are brief."
SID = "ab" * 32   # a well-formed snapshot id no host made


@pytest.fixture(scope="module")
def host(redis_cluster, tmp_path_factory):
    """One `ctx serve --fleet` host on the session's cluster (its keys are emptied per test
    by ``fleet``; the host's heartbeat writes its own again within 2 s)."""
    server = CtxServer(tmp_path_factory.mktemp("host"), "--fleet", redis_cluster.url, "-t", "1", http=True,
                       env={"CTX_HOST_ID": "faults"})
    yield server
    server.stop()


@pytest.fixture
def rc(fleet):
    """A client of the emptied cluster, for writing what ctx never would."""
    client = redis.RedisCluster(host="127.0.0.1", port=fleet.ports[0])
    yield client
    client.close()


def post(host: CtxServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(host.url + path, json=body, timeout=120)


def chat(host: CtxServer, context: str, text: str = "Hi.") -> httpx.Response:
    return post(host, "/v1/chat/completions", {"model": "smollm2", "max_tokens": 4, "temperature": 0,
                                               "messages": [{"role": "user", "content": text}], "context": context})


def fake_snapshot(store, ref: str) -> tuple[str, str]:
    """A one-page snapshot of weights no host serves, published under ``ref``: (its id, its page)."""
    page = bytes(range(64))
    m = Manifest(weight_id="f" * 64, model_name="other", kv_dtype="f16", page_tokens=16, token_ids=[1, 2],
                 page_keys=[page_key(page)], page_size=len(page), n_tokens=2, arch={"kv_layout": 1})
    return store.snapshot(m, [page], ref=ref), page_key(page)


# -- records ctx never wrote ----------------------------------------------------------------
def test_a_bad_host_record_does_not_hide_the_live_hosts(host, rc):
    rc.set("ctx:host:not-json", "not json {")
    rc.set("ctx:host:no-host", '{"url": "http://x"}')
    rc.set("ctx:host:a-list", "[1, 2, 3]")
    rc.hset("ctx:host:a-hash", "f", "v")
    deadline = time.monotonic() + 10
    while True:  # until the host's heartbeat is back after the fixture emptied the cluster
        r = httpx.get(host.url + "/v1/fleet", timeout=60)
        assert r.status_code == 200, r.text
        if [h["host"] for h in r.json()["hosts"]] == ["faults"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [h["host"] for h in r.json()["hosts"]] == ["faults"]
    assert r.json()["stats"]["records_skipped"] >= 4


def test_a_ref_that_is_no_snapshot_id_is_the_servers_trouble_quoted_short(host, fleet, rc, tmp_path):
    rc.set("ctx:r:{u8}", b"\xff\xfe")
    rc.set("ctx:r:{huge}", b"a" * 5_000_000)
    rc.rpush("ctx:r:{listed}", "x")
    for name in ("u8", "huge"):
        for r in (chat(host, name), httpx.get(f"{host.url}/v1/contexts/{name}", timeout=60),
                  post(host, f"/v1/contexts/copy-{name}/restore", {"ref": name})):
            assert r.status_code == 500 and len(r.content) < 1000, (r.status_code, r.text[:300])
            assert f"fleet ref '{name}' holds b'" in r.text and "not a snapshot id" in r.text, r.text
    assert "holds b'\\xff\\xfe', not a snapshot id" in chat(host, "u8").json()["error"]["message"]
    r = chat(host, "listed")   # a key of another type than ctx writes: damage, named
    assert r.status_code == 500 and "key ctx:r:{listed}" in r.text and "WRONGTYPE" in r.text, r.text
    # A listing passes a damaged ref over; gc, which starts from the refs, still runs.
    with ce.Store(tmp_path / "s", fleet=fleet.url, host_id="lister") as store:
        sid, _ = fake_snapshot(store, "good")
        assert store.fleet.refs() == {"good": sid}
        store.fleet.gc(grace=0)
        with pytest.raises(FleetCorrupt, match="holds b'aaaa"):
            store.fleet.get_ref("huge")


def test_hosts_serving_passes_over_entries_that_are_not_times(fleet, rc, tmp_path):
    with ce.Store(tmp_path / "s", fleet=fleet.url, host_id="a") as store:
        store.fleet.heartbeat({}, {"e" * 64: [], "d" * 64: []}, ttl=30)
        rc.hset("ctx:w:" + "e" * 64, "evil", "not-a-number")
        rc.hset("ctx:w:" + "e" * 64, b"\xff", str(int(time.time() * 1000) + 60_000))
        rc.set("ctx:w:" + "c" * 64, "a string, not a hash")
        assert store.fleet.hosts_serving("e" * 64) == ["a"]
        assert store.fleet.hosts_serving("c" * 64) == []


def test_a_page_gone_from_the_fleet_is_damage_not_the_clients_doing(fleet, rc, tmp_path):
    with ce.Store(tmp_path / "a", fleet=fleet.url, host_id="a") as a:
        _, key = fake_snapshot(a, "gone")
    rc.delete("ctx:p:" + key)
    with ce.Store(tmp_path / "b", fleet=fleet.url, host_id="b") as b:
        with pytest.raises(CorruptDataError, match="is in neither the local store nor the fleet") as caught:
            b.get_pages([key])
    assert as_api_error(caught.value).status == 500


# -- conflicts ------------------------------------------------------------------------------
def conflicted(host: CtxServer, rc: redis.RedisCluster, name: str) -> None:
    """``name`` held on the host with a turn of its own, while the fleet's ref moved to a
    snapshot that turn does not descend from: the host's next turn meets a conflict."""
    assert post(host, "/v1/contexts", {"name": name, "system": SYSTEM}).status_code == 201
    assert chat(host, name, "One.").status_code == 200                  # published
    assert post(host, f"/v1/contexts/{name}/append", {"text": " More."}).status_code == 200
    rc.set("ctx:r:{%s}" % name, SID)                                    # "another host" moved it on


def test_a_conflict_stays_a_409_when_the_ref_log_is_damaged(host, rc):
    conflicted(host, rc, "badlog")
    rc.delete("ctx:rl:{badlog}")
    rc.rpush("ctx:rl:{badlog}", "garbage{")
    r = chat(host, "badlog", "Two.")
    assert r.status_code == 409, r.text
    assert f"ref 'badlog' was moved on the fleet to {SID[:16]} meanwhile" in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false"


def test_the_openai_client_sends_a_conflicted_turn_once(host, rc):
    conflicted(host, rc, "once")
    sent = []
    with httpx.Client(event_hooks={"request": [sent.append]}) as http:
        client = openai.OpenAI(base_url=host.url + "/v1", api_key="x", http_client=http)  # max_retries 2
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="smollm2", max_tokens=4, temperature=0, extra_body={"context": "once"},
                                           messages=[{"role": "user", "content": "Two."}])
    assert len(sent) == 1  # a retry would generate, and append, the turn again
    assert caught.value.status_code == 409


def test_an_error_never_echoes_megabytes():
    err = ApiError(400, "snapshot id must be 64 hex digits, got '" + "a" * 5_000_000 + "'")
    assert len(err.message) < 5000 and err.message.endswith("more characters)")
    assert "x-should-retry" not in err.headers() and ApiError(409, "conflict").headers()["x-should-retry"] == "false"


# -- refusals -------------------------------------------------------------------------------
@contextlib.contextmanager
def full(cluster: RedisCluster):
    """Every master at maxmemory (noeviction): writes are refused with OOM."""
    masters = cluster.masters()
    try:
        for port in masters:
            subprocess.run(["redis-cli", "-p", str(port), "config", "set", "maxmemory", "1"], check=True,
                           capture_output=True)
        yield
    finally:
        for port in masters:
            subprocess.run(["redis-cli", "-p", str(port), "config", "set", "maxmemory", "0"], capture_output=True)


def test_a_full_fleet_is_a_503_that_may_pass(host, fleet):
    assert post(host, "/v1/contexts", {"name": "oom", "system": SYSTEM}).status_code == 201
    with full(fleet):
        r = chat(host, "oom")
    assert r.status_code == 503 and "refused: OOM" in r.text, r.text
    assert int(r.headers["retry-after"]) >= 1


def test_a_plain_redis_is_refused_at_start(tmp_path):
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() \
                != "PONG" and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(FleetError, match="not a Redis Cluster .Cluster mode is not enabled"):
            ce.Store(tmp_path / "s", fleet=f"redis://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(10)


# -- a frozen cluster -----------------------------------------------------------------------
def test_a_frozen_cluster_costs_one_bounded_wait_then_fails_at_once(tmp_path):
    cluster = RedisCluster(tmp_path / "redis")
    try:
        with ce.Store(tmp_path / "s", fleet=cluster.url, host_id="a") as store:
            fake_snapshot(store, "frozen")
            for proc in cluster.procs.values():
                proc.send_signal(signal.SIGSTOP)   # connections accepted, never answered
            try:
                t0 = time.monotonic()
                with pytest.raises(FleetUnavailable):
                    store.fleet.get_ref("frozen", or_local=False)
                first = time.monotonic() - t0
                assert first < RETRY_DEADLINE_S, first   # no node answers a PING for 3 s: down, within it
                took = []

                def call():
                    t = time.monotonic()
                    with contextlib.suppress(FleetUnavailable):
                        store.fleet.get_ref("frozen", or_local=False)
                    took.append(time.monotonic() - t)

                callers = [threading.Thread(target=call) for _ in range(8)]
                for t in callers:
                    t.start()
                for t in callers:
                    t.join()
                t0 = time.monotonic()
                assert store.fleet.online is False and store.fleet.hosts() == []
                assert max(took) < 0.5 and time.monotonic() - t0 < 0.5, took   # down: at once, no waiting
            finally:
                for proc in cluster.procs.values():
                    proc.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + 10
            while not store.fleet.online and time.monotonic() < deadline:
                time.sleep(0.2)
            assert store.fleet.get_ref("frozen", or_local=False) is not None
    finally:
        cluster.stop()


# -- host ids -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["日本-host", "bad\r\nSet-Cookie: pwned=1", "two words", "x" * 129])
def test_a_host_id_that_is_not_printable_ascii_is_refused(bad, monkeypatch):
    monkeypatch.setenv("CTX_HOST_ID", bad)
    with pytest.raises(InvalidNameError, match="CTX_HOST_ID .* is not valid: a host id is 1 to 128 printable ASCII"):
        default_host_id()
    assert validate_host_id("web-1.example:8080") == "web-1.example:8080"


def test_ctx_serve_refuses_a_bad_host_id_at_start(tmp_path):
    out = ctx("serve", "--port", free_port(), "--grpc-port", "0", "--no-ollama", "--store", tmp_path / "s",
              home=tmp_path / "home", env={"CTX_HOST_ID": "bad\r\nSet-Cookie: pwned=1"}, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "CTX_HOST_ID 'bad\\r\\nSet-Cookie: pwned=1' is not valid" in out.stderr.strip().splitlines()[-1]
