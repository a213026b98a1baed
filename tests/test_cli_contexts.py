"""The context and store verbs of `ctx`, run as a user runs them: real processes, real model."""
import json
import os
import re
import subprocess
import sys

import pytest

from ctxengine.errors import StoreError


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



def test_an_empty_store_path_is_an_error_not_the_current_directory(tmp_path):
    # Path("") is ".": `ctx ls --store ""` left data.mdb and lock.mdb wherever it ran.
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "ls", "--store", ""], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120)
    one_line_error(r, "store path is empty")
    assert list(tmp_path.iterdir()) == []


def test_names_starting_with_underscore_are_the_servers_and_refused_for_writing(tmp_path):
    # `ctx new _evicted/999999-1/mine` hid the context from ctx ls, and the next ctx gc deleted it.
    s = tmp_path / "store"
    ok("new", "c", store=s)
    ok("export", "c", str(tmp_path / "c.snap"), store=s)
    mine = "_evicted/999999-1/mine"
    for args in (("new", mine), ("fork", "c", mine), ("restore", "c", "--as", mine), ("append", mine, "notes"),
                 ("gen", mine), ("snapshot", "c", "--tag", "_tag"), ("import", str(tmp_path / "c.snap"), "--as", mine),
                 ("import", str(tmp_path / "c.snap"), "--as", mine, "--force"),
                 ("restore", "c", "--as", mine, "--force")):
        one_line_error(ctx(*args, store=s), "names starting with '_' are reserved")
    assert [r["name"] for r in json.loads(ok("ls", "--all", "--json", store=s).stdout)] == ["c"]

    # A server's own refs stay readable (ls --all, log, restore) and removable.
    from ctxengine.store import Store

    with Store(s) as store:
        store.set_ref("_evicted/1-2-3-0/kept", store.resolve("c"))
    assert "_evicted/1-2-3-0/kept" in {r["name"] for r in json.loads(ok("ls", "--all", "--json", store=s).stdout)}
    assert len(ok("log", "_evicted/1-2-3-0/kept", store=s).stdout.splitlines()) == 1
    assert "every page verified" in ok("restore", "_evicted/1-2-3-0/kept", store=s).stderr
    ok("rm", "_evicted/1-2-3-0/kept", store=s)


@pytest.fixture(scope="module")
def model(smollm2_path):
    from ctxengine.state.model import load

    m = load(str(smollm2_path), threads=1)
    yield m
    m.close()


def test_a_save_never_overwrites_what_another_process_saved_meanwhile(tmp_path, model):
    # Two `ctx gen c` at once both said "c: 16 tokens" and the stored c kept only one of them.
    from ctxengine.cli.contexts import open_context, save
    from ctxengine.store import Store

    with Store(tmp_path / "store") as store:
        first = model.context("race")
        first.append("Once upon a time")
        base = save(first, store, "race")
        first.delete()
        mine = open_context(model, store, "race")             # this command reads race ...
        other = model.restore(store, "race", name="other")    # ... and so does another
        other.append(" there lived a cat")
        theirs = other.snapshot(store, ref="race")            # which saves first
        mine.append(" there was a dog")
        with pytest.raises(StoreError) as err:
            save(mine, store, "race")
        msg = str(err.value)
        assert "\n" not in msg and "'race' was changed by another process" in msg, msg
        assert store.refs() == {"race": theirs}
        assert [e.new for e in store.ref_log("race")] == [base, theirs]  # the refused move logged nothing
        kept = re.search(r"snapshot ([0-9a-f]{12})", msg)[1]  # this command's work is kept, for ctx restore --as
        assert store.get_manifest(store.resolve(kept)).token_ids == mine.tokens
        mine.delete()
        other.delete()


def test_a_save_writes_its_snapshot_again_if_a_gc_took_it_before_the_move(tmp_path, model, monkeypatch):
    # The snapshot is written, then the ref moved: in between no ref holds it, and a gc may collect it.
    from ctxengine.cli.contexts import save
    from ctxengine.store import Store

    with Store(tmp_path / "store") as store:
        c = model.context("gc-race")
        c.append("Once upon a time")
        base = save(c, store, "gc-race")
        c.append(" there lived a cat who kept every page of her diary")
        moves, set_ref = [], store.set_ref

        def gc_first(name, sid, **kw):
            moves.append(sid)
            if len(moves) == 1:
                store.gc(grace=0)
                assert sid not in store.snapshots()
            return set_ref(name, sid, **kw)

        monkeypatch.setattr(store, "set_ref", gc_first)
        sid = save(c, store, "gc-race")
        assert len(moves) == 2 and store.refs() == {"gc-race": sid}
        m = store.get_manifest(sid)
        assert m.parent == base and m.token_ids == c.tokens
        c.delete()
        again = model.restore(store, "gc-race", name="gc-race-again")  # every page is there, verified
        assert again.tokens == m.token_ids
        again.delete()


def test_new_does_not_replace_a_context_another_process_created_meanwhile(tmp_path, model, monkeypatch):
    # Two `ctx new x` at once both succeeded; the second's x replaced the first's.
    import argparse

    from ctxengine.cli.contexts import new
    from ctxengine.store import Store

    s = tmp_path / "store"
    p = argparse.ArgumentParser()
    new.add_arguments(p)
    args = p.parse_args(["x", "--system", "Beta system", "--store", str(s)])

    def load_then_lose_the_race(_args):
        # The other `ctx new x` saves while this one loads its model (after require_absent said x is free).
        alpha = model.context("alpha")
        alpha.append_system("Alpha system")
        with Store(s) as store:
            alpha.snapshot(store, ref="x")
        alpha.delete()
        return model

    monkeypatch.setattr(new, "load_model", load_then_lose_the_race)
    with pytest.raises(StoreError, match="'x' was created by another process") as err:
        new.main(args)
    assert "\n" not in str(err.value)
    model.contexts.remove("x")
    with Store(s) as store:
        assert len(store.ref_log("x")) == 1
        assert "Alpha system" in model.detokenize(store.get_manifest(store.resolve("x")).token_ids)


def test_fork_restore_and_tag_refuse_a_name_made_after_their_check(tmp_path, model, monkeypatch):
    # Each checked that its new name was free, then moved the ref wherever it was: a name
    # another process made in between was replaced.
    import argparse

    from ctxengine.cli.contexts import fork, restore, snapshot
    from ctxengine.cli.storecmd import importfile
    from ctxengine.store import Store

    s = tmp_path / "store"
    src = model.context("src")
    src.append("Source text.")
    with Store(s) as store:
        first = src.snapshot(store, ref="src")
        store.export(first, tmp_path / "src.snap")
        src.append(" More.")
        other = src.snapshot(store)
    src.delete()

    def lose_the_race(name):
        def check(store, _name, **_options):  # (import's force=True: its refusal offers --force)
            store.set_ref(name, other)  # the other process, right after the check
        return check

    for verb, argv in ((fork, ["src", "dst"]), (snapshot, ["src", "--tag", "tag"]),
                       (importfile, [str(tmp_path / "src.snap"), "--as", "imp"])):
        p = argparse.ArgumentParser()
        verb.add_arguments(p)
        monkeypatch.setattr(verb, "require_absent", lose_the_race(argv[-1]))
        with pytest.raises(StoreError, match=f"ref '{argv[-1]}' is at {other[:12]} .*expected no ref|"
                                             f"'{argv[-1]}' was created by another process while this import"):
            verb.main(p.parse_args([*argv, "--store", str(s)]))
    p = argparse.ArgumentParser()
    restore.add_arguments(p)
    real_load = restore.load_model

    def load_while_another_makes_it(args):
        with Store(s) as store:
            store.set_ref("as", other)
        return real_load(args)

    monkeypatch.setattr(restore, "load_model", load_while_another_makes_it)
    with pytest.raises(StoreError, match=f"ref 'as' is at {other[:12]}"):
        restore.main(p.parse_args(["src", "--as", "as", "--store", str(s), "--threads", "1"]))
    with Store(s) as store:
        assert {n: store.resolve(n) for n in ("dst", "tag", "as", "imp")} == dict.fromkeys(("dst", "tag", "as", "imp"),
                                                                                            other)
        assert store.resolve("src") == first


def test_log_tells_a_damaged_snapshot_from_a_collected_one(tmp_path):
    """A snapshot whose manifest fails its check was listed as "(collected)", as if gc had
    removed it (found by a probe): it is "(damaged)", said on stderr, and the exit is 1."""
    s = tmp_path / "store"
    ok("new", "x", "--system", "You are a helpful assistant.", store=s)
    sid = refs(s)["x"]["snapshot"]
    data = bytearray((s / "data.mdb").read_bytes())
    at = [m.end() for m in re.finditer(re.escape(bytes.fromhex(sid)), data) if data[m.end():m.end() + 4] == b"CTXP"]
    assert at, "the manifest record is found after its id"
    data[at[0] + 40] ^= 0x10
    (s / "data.mdb").write_bytes(bytes(data))
    r = ctx("log", "x", store=s)
    assert r.returncode == 1 and "(damaged)" in r.stdout and "(collected)" not in r.stdout, r.stdout + r.stderr
    assert f"snapshot {sid} is damaged" in r.stderr
    assert json.loads(ctx("log", "x", "--json", store=s).stdout)[0]["damaged"]
