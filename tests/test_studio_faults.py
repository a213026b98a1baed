"""Faults an outside tester found in the studio, each pinned: the page framed through
/studio/index.html, the tree route failing on a deep chain of forks, and snapshot
refs past the tree's limit left out without a word."""
import sys
import time

import httpx
from fastapi import FastAPI
from starlette.testclient import TestClient

from api_server import module_server
from ctxengine.api import studio
from ctxengine.api.studio_tree import Item, build_tree, dumps

server = module_server("studio-faults")


def depth(root: dict) -> int:
    """The levels below root (without recursion: the trees here are deep)."""
    deepest, stack = 0, [(root, 0)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack += [(c, d + 1) for c in node["children"]]
    return deepest


def test_every_file_under_studio_is_sent_with_the_page_headers():
    app = FastAPI()
    studio.mount(app, runtime=None)  # the routes only hold the runtime; these requests never reach it
    with TestClient(app) as client:
        page = client.get("/studio")
        for path in ("/studio/index.html", "/studio/main.js", "/studio/studio.css"):
            r = client.get(path)
            assert r.status_code == 200, path
            for name in ("content-security-policy", "x-content-type-options", "referrer-policy"):
                assert r.headers.get(name) == page.headers[name], (path, name)
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


def test_a_tree_thousands_deep_is_built_and_written_in_linear_time():
    n = 3000  # a chain: each item one token longer than the last, the prefix tree as deep as the chain
    items = [Item([7] * (k + 1), {"kind": "context", "name": f"c{k}"}, pages=frozenset(range(k // 16 + 1)))
             for k in range(n)]
    t = time.perf_counter()
    root = build_tree(items)
    tree = root.as_json()
    text = dumps({"root": tree})
    took = time.perf_counter() - t
    assert depth(tree) == n and len(root.all_items()) == n
    assert tree["children"][0]["shared_pages"] == 1  # every context below holds page 0
    assert text.startswith('{"root":{"n_tokens":0,') and text.count('"children"') == n + 1
    assert took < 5, f"{took:.1f}s for a chain of {n}"


def test_dumps_writes_what_json_would():
    import json
    value = {"a": [1, 2.5, None, True, "x\"y"], "b": {}, "c": [], "d": {"e": [{"f": "é"}]}, "g": ()}
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))


def test_the_tree_route_serves_a_chain_of_520_forks(server):
    # a chain of about 500 made a RecursionError (a 500), and the studio showed no contexts at all
    with httpx.Client(base_url=server.url, timeout=60) as client:  # one connection: 1,000 requests
        assert client.post("/v1/contexts", json={"name": "chain-0", "text": "chain"}).status_code == 201
        for i in range(1, 521):
            assert client.post(f"/v1/contexts/chain-{i - 1}/fork", json={"name": f"chain-{i}"}).status_code == 201
            assert client.post(f"/v1/contexts/chain-{i}/append", json={"tokens": [28]}).status_code == 200
    t = time.perf_counter()
    r = server.get("/v1/studio/tree")
    took = time.perf_counter() - t
    assert r.status_code == 200, r.text[:300]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # Python's json parser recurses once per level (a browser's does not)
    try:
        (group,) = r.json()["models"]
    finally:
        sys.setrecursionlimit(limit)
    assert group["n_items"] >= 521 and depth(group["root"]) >= 520
    assert took < 10, f"{took:.1f}s"


def test_refs_past_the_limit_are_counted_not_dropped_silently(server):
    assert server.post("/v1/contexts", {"name": "refsrc", "text": "many refs"}).status_code == 201
    n = studio.MAX_TREE_SNAPSHOTS + 7
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(n):
            assert client.post("/v1/contexts/refsrc/snapshot", json={"ref": f"zz-{i:04d}"}).status_code == 200
    tree = server.get("/v1/studio/tree").json()
    assert tree["n_refs_left_out"] == 7
