"""A fleet at its edges (docs/fleet.md, "When the fleet is unreachable"): two
real `ctx serve --fleet` hosts on a real 3-master, 3-replica Redis Cluster
(cluster-node-timeout 2000 ms). A master killed between two turns costs a
failover's worth of retries, never a forked conversation; a cluster that is
down entirely makes named contexts 503 in each dialect (anonymous requests go
on), and the first named request after it is back succeeds."""
from __future__ import annotations

import time

import httpx
import pytest

from redis_cluster import RedisCluster
from servers import CtxServer

SYSTEM = "You are brief."
TURNS = ["Name a colour.", "Another one.", "And a third?"]
BACK_WITHIN_S = 5.0   # a host notices the cluster is back within this


def post(host: CtxServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(host.url + path, json=body, timeout=120)


def chat(host: CtxServer, messages: list[dict], context: str | None = None) -> httpx.Response:
    body = {"model": "smollm2", "max_tokens": 12, "temperature": 0, "messages": messages}
    if context is not None:
        body["context"] = context
    return post(host, "/v1/chat/completions", body)


def reply(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture
def cluster(tmp_path):
    c = RedisCluster(tmp_path / "redis")
    yield c
    c.stop()


def serve(tmp_path, cluster: RedisCluster, name: str) -> CtxServer:
    return CtxServer(tmp_path / name, "--fleet", cluster.url, "-t", "1", http=True, env={"CTX_HOST_ID": name})


def test_a_master_killed_between_turns_costs_a_failover_not_a_fork(cluster, tmp_path):
    a, b = serve(tmp_path, cluster, "a"), serve(tmp_path, cluster, "b")
    try:
        assert post(a, "/v1/contexts", {"name": "conv", "system": SYSTEM}).status_code == 201
        messages = [{"role": "system", "content": SYSTEM}]
        for host, text in zip((a, b), TURNS):          # turn 1 on A, turn 2 on B
            said = reply(chat(host, [{"role": "user", "content": text}], "conv"))
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": said}]

        victim = cluster.master_of("ctx:r:{conv}")      # the master holding the conversation's ref
        cluster.kill(victim)
        cluster.wait_failover(victim)
        time.sleep(3)  # both hosts' heartbeats meet the dead master meanwhile

        third = reply(chat(a, [{"role": "user", "content": TURNS[2]}], "conv"))
        messages.append({"role": "user", "content": TURNS[2]})
        whole = reply(chat(a, messages))                  # the whole conversation, no context
        assert third == whole                             # A continued from B's turn, not its own copy
        listing = httpx.get(a.url + "/v1/fleet", timeout=60).json()
        assert listing["online"] is True
        assert {h["host"] for h in listing["hosts"]} == {"a", "b"}
    finally:
        a.stop()
        b.stop()
    for host in (a, b):
        assert "warning: fleet" not in host.log()  # never local-only: the promoted replica took over


ERROR_SHAPES = {  # dialect: (path, body, how its error names the message)
    "openai": ("/v1/chat/completions", {"model": "smollm2", "max_tokens": 4, "context": "conv",
                                        "messages": [{"role": "user", "content": "Hi."}]},
               lambda j: j["error"]["message"]),
    "anthropic": ("/v1/messages", {"model": "smollm2", "max_tokens": 4, "context": "conv",
                                   "messages": [{"role": "user", "content": "Hi."}]},
                  lambda j: j["type"] == "error" and j["error"]["message"]),
    "ollama": ("/api/chat", {"model": "smollm2", "stream": False, "context": "conv", "options": {"num_predict": 4},
                             "messages": [{"role": "user", "content": "Hi."}]},
               lambda j: j["error"]),
}


def test_a_cluster_down_refuses_named_contexts_and_is_noticed_back(cluster, tmp_path):
    a = serve(tmp_path, cluster, "a")
    try:
        assert post(a, "/v1/contexts", {"name": "conv", "system": SYSTEM}).status_code == 201
        reply(chat(a, [{"role": "user", "content": TURNS[0]}], "conv"))
        cluster.stop_all()

        for dialect, (path, body, message) in ERROR_SHAPES.items():
            r = post(a, path, body)
            assert r.status_code == 503, (dialect, r.text)
            assert int(r.headers["retry-after"]) >= 1
            assert "fleet" in message(r.json()) and "unreachable" in message(r.json()), (dialect, r.text)
        assert post(a, "/v1/contexts/copy/restore", {"ref": "conv"}).status_code == 503  # not A's older ref
        assert httpx.get(a.url + "/v1/contexts/conv", timeout=60).status_code == 503
        reply(chat(a, [{"role": "user", "content": "Hi."}]))   # anonymous: served all along
        assert httpx.get(a.url + "/v1/fleet", timeout=60).json()["online"] is False

        cluster.start_all()
        started = time.monotonic()
        while True:
            r = chat(a, [{"role": "user", "content": TURNS[1]}], "conv")
            if r.status_code != 503 or time.monotonic() - started > BACK_WITHIN_S:
                break
            time.sleep(0.2)
        reply(r)
        assert time.monotonic() - started <= BACK_WITHIN_S
    finally:
        a.stop()
    assert a.log().count("warning: fleet") == 1 and "is reachable again" in a.log()


def test_a_turn_the_fleet_missed_is_published_before_the_next_one(cluster, tmp_path):
    a, b = serve(tmp_path, cluster, "a"), serve(tmp_path, cluster, "b")
    try:
        assert post(a, "/v1/contexts", {"name": "conv", "system": SYSTEM}).status_code == 201
        reply(chat(a, [{"role": "user", "content": TURNS[0]}], "conv"))
        body = {"model": "smollm2", "max_tokens": 120, "temperature": 0, "stream": True, "context": "conv",
                "messages": [{"role": "user", "content": "Tell me a story about the sea."}]}
        with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, timeout=300) as r:
            lines = r.iter_lines()
            next(lines)
            cluster.stop_all()          # the cluster goes while the turn is being generated
            assert r.status_code == 200 and "[DONE]" in "".join(lines)  # the reply is whole; kept local
        cluster.start_all()
        started = time.monotonic()
        while (r := chat(a, [{"role": "user", "content": TURNS[1]}], "conv")).status_code == 503:
            assert time.monotonic() - started < BACK_WITHIN_S, r.text
            time.sleep(0.2)
        reply(r)   # the missed turn went to the fleet first (a fast-forward), then this one
        on_a = httpx.get(a.url + "/v1/contexts/conv", timeout=60).json()
        on_b = httpx.get(b.url + "/v1/contexts/conv", timeout=60).json()
        assert "story" in on_b["text"] and on_b["text"] == on_a["text"]
    finally:
        a.stop()
        b.stop()
