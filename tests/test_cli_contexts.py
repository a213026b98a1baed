"""The context and store verbs of `ctx`, run as a user runs them: real processes, real model."""
import json
import os
import subprocess
import sys

import pytest


def ctx(*args, store, input=None, env=None):
    e = dict(os.environ, **(env or {}))
    e.pop("CTX_STORE", None)
    return subprocess.run([sys.executable, "-m", "ctxengine.cli.main", *args, *(["--store", str(store)] if store else [])],
                          capture_output=True, text=True, input=input, env=e, timeout=120)


def ok(*args, store, **kw):
    r = ctx(*args, store=store, **kw)
    assert r.returncode == 0, f"ctx {' '.join(args)}: {r.stderr}"
    return r


def one_line_error(r, *needles):
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def refs(store) -> dict:
    return {row["name"]: row for row in json.loads(ok("ls", "--json", store=store).stdout)}


def test_context_flow_offline(tmp_path):
    s = tmp_path / "store"
    ok("new", "chat", "--system", "You are a helpful assistant.", store=s)
    one_line_error(ctx("new", "chat", store=s), "already exists")
    ok("append", "chat", "--role", "user", "What is the capital of France?", store=s)
    r = ok("gen", "chat", "-n", "8", store=s)
    assert "Paris" in r.stdout
    first = refs(s)["chat"]

    # gen again continues from the stored state (greedy: deterministic).
    ok("fork", "chat", "b", store=s)
    assert refs(s)["b"]["snapshot"] == first["snapshot"]
    ok("append", "b", "--role", "user", "And of Italy?", store=s)
    r = ok("gen", "b", "-n", "8", store=s)
    assert "Rome" in r.stdout
    b = refs(s)["b"]
    assert b["tokens"] > first["tokens"] and b["parent"] != b["snapshot"]
    assert refs(s)["chat"] == first  # forking copied; it did not move chat

    # snapshot prints the id; --tag names it; restore --as brings it back under a new name.
    sid = ok("snapshot", "chat", "--tag", "t1", store=s).stdout.strip()
    assert sid == first["snapshot"]
    r = ok("restore", "t1", "--as", "c2", "--text", store=s)
    assert "every page verified" in r.stderr and "Paris" in r.stdout
    assert refs(s)["c2"]["snapshot"] == sid
    one_line_error(ctx("restore", "b", "--as", "c2", store=s), "already exists")

    # log: newest first, one entry per move.
    log = json.loads(ok("log", "b", "--json", store=s).stdout)
    assert [e["new"] for e in log][0] == b["snapshot"] and log[-1]["old"] is None
    assert len(ok("log", "chat", store=s).stdout.strip().splitlines()) == 3  # new, append, gen

    # export, rm, gc, import: the same snapshot comes back.
    ok("export", "b", str(tmp_path / "b.snap"), store=s)
    ok("rm", "b", store=s)
    assert "b" not in refs(s)
    r = ok("gc", store=s)
    assert "removed 2 snapshots" in r.stdout
    ok("import", str(tmp_path / "b.snap"), store=s)
    assert refs(s)["b"]["snapshot"] == b["snapshot"]
    ok("gen", "b", "-n", "2", store=s)

    stats = json.loads(ok("store", "stats", "--json", store=s).stdout)
    assert stats["n_refs"] == 4 and stats["dedup_ratio"] > 1.0
    assert "dedup ratio" in ok("store", "stats", store=s).stdout


def test_store_comes_from_the_environment(tmp_path):
    env = {"CTX_STORE": str(tmp_path / "envstore")}
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "new", "e"], capture_output=True, text=True,
                       env=dict(os.environ, **env), timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "envstore" / "data.mdb").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_export_is_refused_and_stores_nothing(tmp_path, damage):
    s = tmp_path / "store"
    ok("new", "x", "--system", "A context to travel.", store=s)
    f = tmp_path / "x.snap"
    ok("export", "x", str(f), store=s)
    data = bytearray(f.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data[len(data) // 2] ^= 0x10
    bad = tmp_path / "bad.snap"
    bad.write_bytes(bytes(data))
    other = tmp_path / "other"
    one_line_error(ctx("import", str(bad), store=other), "bad.snap refused, nothing was stored")
    assert refs(other) == {}
    assert json.loads(ok("store", "stats", "--json", store=other).stdout)["n_pages"] == 0


def test_errors_are_one_line(tmp_path):
    s = tmp_path / "store"
    one_line_error(ctx("append", "nobody", "hi", store=s), "no context named 'nobody'")
    one_line_error(ctx("new", "../evil", store=s), "'..'")
    one_line_error(ctx("gen", "nobody", store=s), "nobody")
    one_line_error(ctx("rm", "nobody", store=s), "nobody")
    one_line_error(ctx("restore", "deadbeefdeadbeef", store=s), "deadbeefdeadbeef")
    one_line_error(ctx("import", str(tmp_path / "missing.snap"), store=s), "missing.snap")


def test_kv_dtype_is_chosen_per_load_and_checked_on_restore(tmp_path):
    s = tmp_path / "store"
    ok("new", "q", "--kv", "q8", store=s)
    ok("append", "q", "The capital of France is", "--kv", "q8", store=s)
    r = ok("gen", "q", "-n", "4", "--kv", "q8", store=s)
    assert r.stdout.strip()
    one_line_error(ctx("gen", "q", "-n", "4", store=s), "holds its KV in q8", "kv='f16'", "--kv q8")

