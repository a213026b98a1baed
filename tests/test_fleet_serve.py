"""`ctx serve --fleet`: three hosts sharing one real Redis Cluster. A
conversation started on A continues on B and then C exactly as it would have
on one host; only the pages a host lacks cross; /v1/fleet and X-Ctx-Host say
who is who."""
from __future__ import annotations

import signal
import threading

import httpx
import pytest

import ctxengine as ce
from conftest import smollm2_file
from ctxengine.engine.weights import cached_weight_id
from ctxengine.store import Manifest, page_key
from redis_cluster import fleet, redis_cluster  # noqa: F401 (fixtures)
from servers import CtxServer, fleet_hosts, free_port

TURNS = ["Name a colour.", "Another one.", "And a third?"]
SYSTEM = "You are brief."
PAGE = 16  # tokens a KV page holds


def post(host: CtxServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(host.url + path, json=body, timeout=120)


def get(host: CtxServer, path: str) -> httpx.Response:
    return httpx.get(host.url + path, timeout=60)


def turn(host: CtxServer, context: str, text: str) -> httpx.Response:
    r = post(host, "/v1/chat/completions", {"model": "smollm2", "max_tokens": 12, "temperature": 0,
                                            "messages": [{"role": "user", "content": text}], "context": context})
    assert r.status_code == 200, r.text
    return r


@pytest.fixture
def hosts(fleet, tmp_path):
    with fleet_hosts(tmp_path, fleet.url, "abc") as started:
        yield started


def fleet_stats(host: CtxServer) -> dict:
    return get(host, "/v1/fleet").json()["stats"]


def test_a_conversation_moves_across_hosts_bit_identically(hosts, fleet):
    a, b, c = hosts
    assert post(a, "/v1/contexts", {"name": "conv", "system": SYSTEM}).status_code == 201
    got, served, n_tokens = [], [], [get(a, "/v1/contexts/conv").json()["n_tokens"]]
    for host, text in zip((a, b, c), TURNS):
        r = turn(host, "conv", text)
        got.append(r.json()["choices"][0]["message"]["content"])
        served.append(r.headers["x-ctx-host"])
        card = get(host, "/v1/contexts/conv").json()
        n_tokens.append(card["n_tokens"])
    assert served == ["a", "b", "c"] and card["host"] == "c"
    # Each host sent exactly the pages its turn changed (the last partial one onwards),
    # and B fetched what A had sent.
    stats = {h: fleet_stats(h) for h in hosts}
    for i, host in enumerate(hosts):
        assert stats[host]["pages_sent"] == -(-n_tokens[i + 1] // PAGE) - n_tokens[i] // PAGE
    assert stats[b]["pages_fetched"] == stats[a]["pages_sent"]
    sent = sum(s["pages_sent"] for s in stats.values())
    assert sent == len(fleet.keys("ctx:p:*"))  # nothing was written twice

    # The same conversation on one host: the same replies, and (the KV being
    # deterministic) the very same pages, so its publishing sends none.
    post(a, "/v1/contexts", {"name": "alone", "system": SYSTEM})
    expected = [turn(a, "alone", t).json()["choices"][0]["message"]["content"] for t in TURNS]
    assert got == expected
    assert get(a, "/v1/contexts/alone").json()["text"] == card["text"]
    assert fleet_stats(a)["pages_sent"] == stats[a]["pages_sent"]

    # A's own copy is stale now: asked again, A continues from C's turn, not its own
    r = turn(a, "conv", "Thanks.")
    assert r.headers["x-ctx-host"] == "a"
    assert get(a, "/v1/contexts/conv").json()["text"].startswith(card["text"])

    snap = post(a, "/v1/contexts/conv/snapshot", {"ref": "conv"}).json()
    assert snap["published"] is True  # on the fleet, the ref at it, acknowledged by a replica

    listing = get(b, "/v1/fleet").json()
    assert listing["online"] is True and listing["host"] == "b"
    by_host = {h["host"]: h for h in listing["hosts"]}
    assert set(by_host) == {"a", "b", "c"}  # beats: at start, on each model load or unload, every 2 s
    assert by_host["b"]["models"] == ["smollm2"] and by_host["b"]["weight_ids"] == [card["weight_id"]]


def test_a_context_of_weights_no_host_here_serves_is_refused(hosts, fleet, tmp_path):
    a = hosts[0]
    with ce.Store(tmp_path / "maker", fleet=fleet.url, host_id="maker") as store:
        # every host says it can restore SmolLM2's snapshots, loaded or not
        assert store.fleet.hosts_serving(cached_weight_id(smollm2_file())) == ["a", "b", "c"]
        page = bytes(64)
        m = Manifest(weight_id="f" * 64, model_name="other", kv_dtype="f16", page_tokens=16, token_ids=[1, 2],
                     page_keys=[page_key(page)], page_size=len(page), n_tokens=2, arch={"kv_layout": 1})
        store.snapshot(m, [page], ref="foreign")
    r = get(a, "/v1/contexts/foreign")
    assert r.status_code == 400, r.text
    assert f"made by weights {'f' * 64} (other), which this host does not serve" in r.json()["error"]["message"]


def test_a_host_moving_a_ref_it_did_not_follow_gets_a_conflict(hosts):
    a, b, c = hosts
    post(a, "/v1/contexts", {"name": "race", "system": SYSTEM})
    turn(a, "race", TURNS[0])                # published: race -> S1
    assert post(b, "/v1/contexts/race/append", {"text": " Other."}).status_code == 200  # B: S1 + a change
    turn(a, "race", TURNS[1])                # A moves race on: S1 -> S2
    winner = get(a, "/v1/contexts/race").json()["snapshot_id"]
    r = post(b, "/v1/contexts/race/snapshot", {"ref": "race"})  # B's change descends from S1, not S2
    assert r.status_code == 409 and "ref 'race' was moved on the fleet" in r.text, r.text
    assert "by host a" in r.json()["error"]["message"]
    assert get(b, "/v1/fleet").json()["stats"]["conflicts"] == 1
    assert get(c, "/v1/contexts/race").json()["snapshot_id"] == winner  # the ref still names A's turn


def test_a_host_killed_mid_generation_leaves_its_last_turn_to_the_others(hosts):
    a, b, _ = hosts
    post(a, "/v1/contexts", {"name": "survivor", "system": SYSTEM})
    turn(a, "survivor", TURNS[0])
    last = get(a, "/v1/contexts/survivor").json()
    first_piece = threading.Event()

    def long_turn():
        body = {"model": "smollm2", "max_tokens": 2000, "temperature": 0, "stream": True, "context": "survivor",
                "messages": [{"role": "user", "content": "Tell me a very long story."}]}
        try:
            with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    first_piece.set()
        except httpx.HTTPError:
            pass  # the host died under it, as intended

    streaming = threading.Thread(target=long_turn)
    streaming.start()
    assert first_piece.wait(60)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    streaming.join(60)
    got = get(b, "/v1/contexts/survivor").json()   # B restores the last published turn
    assert (got["snapshot_id"], got["n_tokens"], got["host"]) == (last["snapshot_id"], last["n_tokens"], "b")
    assert turn(b, "survivor", TURNS[1]).headers["x-ctx-host"] == "b"


def test_the_grpc_face_follows_the_fleet_too(fleet, tmp_path):
    from ctxengine.rpc import Remote

    a = CtxServer(tmp_path / "ga", "--fleet", fleet.url, "-t", "1", env={"CTX_HOST_ID": "ga"})
    b = CtxServer(tmp_path / "gb", "--fleet", fleet.url, "-t", "1", env={"CTX_HOST_ID": "gb"})
    try:
        with Remote(a.target) as ra, Remote(b.target) as rb:
            g = ra.create("g")
            g.append("The capital of France is")
            list(g.generate(6, temperature=0.0))       # published after the generation
            on_b = rb.context("g")                      # B restores it from the fleet
            assert on_b.tokens == g.refresh().tokens
            list(on_b.generate(6, temperature=0.0))
            assert ra.context("g").tokens == on_b.refresh().tokens  # A follows B's turn
    finally:
        a.stop()
        b.stop()


def test_a_host_whose_fleet_is_unreachable_serves_anonymous_requests_only(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}"
    host = CtxServer(tmp_path / "alone", "--fleet", url, "-t", "1", http=True, env={"CTX_HOST_ID": "alone"})
    try:
        r = post(host, "/v1/chat/completions", {"model": "smollm2", "max_tokens": 4, "temperature": 0,
                                                 "messages": [{"role": "user", "content": TURNS[0]}]})
        assert r.status_code == 200 and r.headers["x-ctx-host"] == "alone"
        # A named context could be further along on the fleet: refused, not forked (docs/fleet.md),
        # nor made here under a name the fleet may hold (it was: 201, a copy shadowing the fleet's)
        for body in ({"name": "solo", "system": SYSTEM}, {"system": SYSTEM}):
            made = post(host, "/v1/contexts", body)
            assert made.status_code == 503 and made.headers["retry-after"] == "1", made.text
        r = post(host, "/v1/chat/completions", {"model": "smollm2", "max_tokens": 4, "context": "solo",
                                                 "messages": [{"role": "user", "content": TURNS[0]}]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["message"] == f"fleet {url} is unreachable"
        fleet_info = get(host, "/v1/fleet").json()
        assert fleet_info["online"] is False and fleet_info["hosts"] == []
    finally:
        host.stop()
    assert host.log().count("warning: fleet") == 1
