"""The studio's JSON routes (/v1/studio/...) and its static files, against a
real `ctx serve`: the prefix tree of contexts and snapshots with the pages
they share, a context's turns, models, store stats and gc, export, and the
live counters behind the plots."""
import io

import httpx

from api_server import module_server
from api_server import model, openai_client  # noqa: F401 (fixtures)
from ctxengine.store import Store

server = module_server("studio-api")


def tokens(server, name: str) -> list[int]:
    return server.get(f"/v1/contexts/{name}", params={"tokens": "true"}).json()["tokens"]


def find(node: dict, pred) -> dict | None:
    if pred(node):
        return node
    for c in node["children"]:
        hit = find(c, pred)
        if hit is not None:
            return hit
    return None


def keys(node: dict) -> set[str]:
    return {i.get("name") or i["ref"] for i in node["items"]}


def test_the_page_is_served_with_a_strict_policy(server):
    r = server.get("/studio")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/studio/main.js">' in r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    for name in ("main.js", "api.js", "chat.js", "tree.js", "plots.js", "panels.js", "ui.js", "studio.css"):
        f = server.get(f"/studio/{name}")
        assert f.status_code == 200 and f.text, name
    assert server.get("/studio/main.js").headers["content-type"].split(";")[0] in ("text/javascript",
                                                                                    "application/javascript")
    assert server.get("/studio/../server.py").status_code == 404
    assert server.get("/studio/nothing.js").status_code == 404


def test_tree_shows_forks_as_branches_sharing_pages(server):
    text = "The quick brown fox jumps over the lazy dog. " * 4   # a few full pages
    assert server.post("/v1/contexts", {"name": "trunk", "text": text}).status_code == 201
    n_trunk = len(tokens(server, "trunk"))
    assert server.post("/v1/contexts/trunk/fork", {"name": "left"}).status_code == 201
    assert server.post("/v1/contexts/trunk/fork", {"name": "right"}).status_code == 201
    server.post("/v1/contexts/left/append", {"text": " Then it slept."})
    server.post("/v1/contexts/right/append", {"text": " Then it ran away."})
    snap = server.post("/v1/contexts/left/snapshot", {"ref": "left-saved"}).json()

    tree = server.get("/v1/studio/tree").json()
    (group,) = tree["models"]
    assert group["model"] == "smollm2" and group["served"] and group["n_items"] >= 4  # others' items may be there
    assert all(find(group["root"], lambda n, k=k: k in keys(n)) for k in ("trunk", "left", "right", "left-saved"))
    trunk = find(group["root"], lambda n: "trunk" in keys(n))
    assert trunk["n_tokens"] == n_trunk and len(trunk["children"]) >= 1
    # left and right share more than the trunk (their appended texts both start with " Then it")
    branch = find(trunk, lambda n: len(n["children"]) == 2)
    a, b = tokens(server, "left"), tokens(server, "right")
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert branch["n_tokens"] == shared
    # forks share every page that was full when they were made (the last, partial one is copied on write)
    assert trunk["shared_pages"] == n_trunk // 16 > 0
    left = find(group["root"], lambda n: "left" in keys(n))
    assert keys(left) == {"left", "left-saved"}  # the snapshot sits where the context it was taken of is
    saved = next(i for i in left["items"] if i["kind"] == "snapshot")
    assert saved["snapshot_id"] == snap["snapshot_id"] and saved["n_tokens"] == len(a)


def test_messages_are_the_turns_with_their_token_ranges(server, openai_client, model):
    server.post("/v1/contexts", {"name": "talk", "system": "You are terse."})
    r = openai_client.chat.completions.create(model="smollm2", max_tokens=8, temperature=0,
                                              messages=[{"role": "user", "content": "Hi there."}],
                                              extra_body={"context": "talk"})
    got = server.get("/v1/studio/contexts/talk/messages").json()
    msgs = got["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert [m["text"] for m in msgs] == ["You are terse.", "Hi there.", r.choices[0].message.content.strip()]
    ids = tokens(server, "talk")
    assert msgs[0]["start"] == 0 and msgs[-1]["end"] == len(ids) == got["n_tokens"]
    assert all(m["end"] == n["start"] for m, n in zip(msgs, msgs[1:]))
    # a fork through message 2 holds exactly the rendering of the first two turns
    two = model.chat_prompt([{"role": "system", "content": "You are terse."},
                             {"role": "user", "content": "Hi there."}], add_generation_prompt=False)
    assert ids[:msgs[1]["end"]] == model.tokenize(two, parse_special=True)
    # plain text has no turns: one message
    server.post("/v1/contexts", {"name": "plain", "text": "Roses are red"})
    (m,) = server.get("/v1/studio/contexts/plain/messages").json()["messages"]
    assert m["role"] == "text" and m["text"] == "Roses are red"
    assert server.get("/v1/studio/contexts/_request/1/messages").status_code == 400
    assert server.get("/v1/studio/contexts/nobody/messages").status_code == 404


def test_models_store_gc_and_export(server, tmp_path):
    # A context of its own first: the model is loaded and holds pages whatever ran before.
    server.post("/v1/contexts", {"name": "keep", "text": "Something worth keeping, for a while."})
    models = server.get("/v1/studio/models").json()
    smol = next(m for m in models["data"] if m["name"] == "smollm2")
    assert smol["servable"] and smol["loaded"] and smol["kv"] == "f16"
    assert smol["memory_bytes"] > smol["file_bytes"] > 0 and 0 < smol["kv_pages_in_use"] <= smol["kv_pages_max"]
    assert models["memory_budget"] > 0

    sid = server.post("/v1/contexts/keep/snapshot", {"ref": "keep"}).json()["snapshot_id"]
    before = server.get("/v1/studio/store").json()
    assert before["n_refs"] >= 1 and before["n_manifests"] >= 1 and before["dedup_ratio"] >= 1.0

    exported = server.get("/v1/studio/refs/keep/export")
    assert exported.status_code == 200 and "keep.ctxsnap" in exported.headers["content-disposition"]
    other = Store(tmp_path / "other")
    try:
        assert other.import_file(io.BytesIO(exported.content), ref="keep") == sid
    finally:
        other.close()

    got = server.get("/v1/studio/refs/keep/messages").json()
    assert got["snapshot_id"] == sid and got["model"] == "smollm2" and got["messages"][0]["text"].startswith("Something")

    assert httpx.delete(f"{server.url}/v1/studio/refs/keep").json()["deleted"] is True
    assert httpx.post(f"{server.url}/v1/studio/store/gc", content=b"{}",
                      headers={"Content-Type": "text/plain"}).status_code == 400  # what another site could send
    gc = server.post("/v1/studio/store/gc", {}).json()
    assert gc["manifests_removed"] >= 1
    after = server.get("/v1/studio/store").json()
    assert after["n_manifests"] == before["n_manifests"] - gc["manifests_removed"]
    assert server.get("/v1/studio/refs/keep/export").status_code == 404
    assert httpx.delete(f"{server.url}/v1/studio/refs/keep").status_code == 404
    assert httpx.delete(f"{server.url}/v1/studio/refs/_evicted/x").status_code == 400


def test_live_counters_count_tokens_as_they_stream(server, openai_client):
    for max_tokens in (6, 200):  # the second ends with an end-of-turn token, which streams no text
        before = server.metric("ctx_sampled_tokens_total"), server.metric("ctx_generated_tokens_total")
        r = openai_client.chat.completions.create(model="smollm2", max_tokens=max_tokens, temperature=0,
                                                  messages=[{"role": "user", "content": "Say hi."}])
        sampled = server.metric("ctx_sampled_tokens_total") - before[0]
        generated = server.metric("ctx_generated_tokens_total") - before[1]
        assert sampled == generated == r.usage.completion_tokens  # every sampled token, when it ends
    assert r.choices[0].finish_reason == "stop"
    assert "ctx_forward_queue{" in server.get("/metrics").text


def test_info(server, model):
    info = server.get("/v1/studio/info").json()
    assert info["kv"] == "f16" and info["default_model"] == "smollm2" and info["store"] is True
    assert "smollm2" in info["models"]


def test_binding_beyond_loopback_without_a_key_is_warned_of():
    from ctxengine.cli.serve import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.20", "myhost.example"))
