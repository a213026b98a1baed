"""The serving runtime: models by name, loaded on first use, unloaded past the
memory budget (never while a request or a client's context needs them)."""
import threading

import pytest

from ctxengine.engine.catalog import CatalogEntry, ModelCatalog
from ctxengine.errors import ContextError, ModelNotFoundError, UnsupportedModelError
from ctxengine.serving.runtime import Runtime
from tiny_models import write_tiny_models


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    return write_tiny_models(tmp_path_factory.mktemp("models"))


def runtime_for(paths, **kw) -> Runtime:
    return Runtime(ModelCatalog.build(paths, packaged=False), **kw)


def test_catalog_names_files_by_stem_and_lists_unservable_entries(tiny_paths, tmp_path):
    cat = ModelCatalog.build([*tiny_paths, tmp_path / "missing.gguf"], packaged=False)
    names = [e.name for e in cat.entries()]
    assert names[:2] == ["tiny-1", "tiny-2"]
    assert cat.get("tiny-1.gguf").path == tiny_paths[0]  # the file name is an alias
    broken = cat.get(str(tmp_path / "missing.gguf"))
    assert not broken.servable and "nor a file" in broken.error
    assert cat.default.name == "tiny-1"
    with pytest.raises(ModelNotFoundError, match="served here: tiny-1, tiny-2"):
        cat.get("nope")


def test_models_dir_is_scanned_recursively(tiny_paths):
    cat = ModelCatalog.build(models_dir=tiny_paths[0].parent, packaged=False)
    assert sorted(e.name for e in cat.entries()) == ["tiny-1", "tiny-2"]
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        ModelCatalog.build(models_dir=tiny_paths[0].parent / "nowhere", packaged=False)


def test_unservable_model_is_refused_with_its_reason(tmp_path):
    rt = Runtime(ModelCatalog([CatalogEntry("broken", None, "ollama", error="missing blob sha256-00")]))
    with pytest.raises(UnsupportedModelError, match="missing blob sha256-00"):
        rt.model("broken")
    with pytest.raises(ModelNotFoundError, match="no model can be served"):
        rt.model(None)


def test_loads_once_and_by_default(tiny_paths):
    rt = runtime_for(tiny_paths, threads=1)
    got = []
    threads = [threading.Thread(target=lambda: got.append(rt.model("tiny-2"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(m) for m in got}) == 1  # concurrent first uses load it once
    assert rt.model(None).path == tiny_paths[0]
    assert [e.entry.name for e in rt.loaded()] == ["tiny-1", "tiny-2"]  # most recently used first
    rt.close()


def test_least_recently_used_model_is_unloaded_past_the_budget(tiny_paths):
    rt = runtime_for(tiny_paths, threads=1, memory_budget=1)  # room for one model at a time
    rt.model("tiny-1")
    rt.model("tiny-2")
    assert [e.entry.name for e in rt.loaded()] == ["tiny-2"]
    rt.close()


def test_a_leased_model_or_one_holding_a_context_is_never_unloaded(tiny_paths):
    rt = runtime_for(tiny_paths, threads=1, memory_budget=1)
    with rt.lease("tiny-1") as m1:
        rt.model("tiny-2")
        assert {e.entry.name for e in rt.loaded()} == {"tiny-1", "tiny-2"}
        c = m1.context("work")
        c.append([1, 2, 3])
    rt.model("tiny-2")  # tiny-1 holds a client's context: still kept
    assert {e.entry.name for e in rt.loaded()} == {"tiny-1", "tiny-2"}
    assert rt.unload("tiny-1") is False
    c.delete()
    assert rt.unload("tiny-1") is True
    assert [e.entry.name for e in rt.loaded()] == ["tiny-2"]
    rt.close()


def test_models_that_overlapped_are_brought_back_under_the_budget_when_the_lease_ends(tiny_paths):
    # The budget was checked only when a model loaded: a model loaded while another was
    # leased stayed loaded beside it for good.
    rt = runtime_for(tiny_paths, threads=1, memory_budget=1)
    with rt.lease("tiny-1"):
        with rt.lease("tiny-2"):
            pass  # tiny-1 is in use: both stay
        assert {e.entry.name for e in rt.loaded()} == {"tiny-1", "tiny-2"}
    assert [e.entry.name for e in rt.loaded()] == ["tiny-1"]  # the least recently used idle one went
    with rt.lease("tiny-2"):
        pass
    assert [e.entry.name for e in rt.loaded()] == ["tiny-2"]  # as in the sequential case
    rt.close()


def test_keep_alive_zero_unloads_after_the_request(tiny_paths):
    rt = runtime_for(tiny_paths, threads=1)
    with rt.lease("tiny-1"):
        rt.keep_alive("tiny-1", 0)
        assert [e.entry.name for e in rt.loaded()] == ["tiny-1"]  # in use: stays until the lease ends
    assert rt.loaded() == []
    rt.model("tiny-1")
    rt.keep_alive("tiny-1", -1)
    assert [e.entry.name for e in rt.loaded()] == ["tiny-1"]
    rt.close()


def test_keep_alive_is_an_idle_timer_that_each_request_restarts(tiny_paths):
    # It was a deadline from when it was set: a model in steady use was unloaded at it.
    import time
    rt = runtime_for(tiny_paths, threads=1)
    rt.model("tiny-1")
    rt.keep_alive("tiny-1", 0.6)
    for _ in range(4):
        time.sleep(0.25)
        with rt.lease("tiny-1"):
            pass  # a request without a keep_alive of its own
    assert [e.entry.name for e in rt.loaded()] == ["tiny-1"]  # 1 s after it was set, still loaded
    (loaded,) = rt.loaded()
    assert loaded.expires_at > time.time()
    rt.close()


def test_an_endless_keep_alive_is_forever(tiny_paths):
    from ctxengine.api.ollama import keep_alive_seconds
    assert keep_alive_seconds("999999999h") is None and keep_alive_seconds(1e30) is None  # /api/ps was a 500
    assert keep_alive_seconds(10 ** 400) is None and keep_alive_seconds("5m") == 300.0


def test_context_names_are_unique_across_models(tiny_paths):
    rt = runtime_for(tiny_paths, threads=1)
    a = rt.create_context("shared-name", "tiny-1")
    with pytest.raises(ContextError, match="already exists"):
        rt.create_context("shared-name", "tiny-2")
    assert rt.find_context("shared-name") is a
    assert [c.name for c in rt.contexts()] == ["shared-name"]
    with pytest.raises(ContextError, match="no context named 'other'"):
        rt.find_context("other")
    rt.close()


def test_a_name_made_on_two_models_at_once_is_made_once(tiny_paths, monkeypatch):
    # Each model's table checks only its own names: a fork (or a restore, which reads its
    # pages in between) on one model and a create on another, under one name at once, both
    # won, and the name then meant whichever table was searched first.
    rt = runtime_for(tiny_paths, threads=1)
    src = rt.create_context("src", "tiny-1")
    table = rt.sessions.models.model("tiny-1").contexts
    adopt, entered, go = table.adopt, threading.Event(), threading.Event()

    def slow_adopt(*args, **kw):  # the fork's context reaches its table only after the create ran
        entered.set()
        go.wait(10)
        return adopt(*args, **kw)

    monkeypatch.setattr(table, "adopt", slow_adopt)
    results = {}
    fork = threading.Thread(target=lambda: results.update(fork=rt.sessions.fork(src, "twice")))
    fork.start()
    assert entered.wait(10)
    with pytest.raises(ContextError, match="a context named 'twice' already exists"):
        rt.create_context("twice", "tiny-2")
    go.set()
    fork.join()
    assert rt.find_context("twice") is results["fork"]
    assert sorted(c.name for c in rt.contexts()) == ["src", "twice"]
    rt.close()


def test_unnamed_contexts_get_names_no_other_model_has(tiny_paths):
    # Each table counted its own ctx-1, ctx-2, ...: the first unnamed context of each model
    # was "ctx-1".
    rt = runtime_for(tiny_paths, threads=1)
    names = [rt.create_context(None, m).name for m in ("tiny-1", "tiny-2", "tiny-1", "tiny-2")]
    assert len(set(names)) == 4 and all(n.startswith("ctx-") for n in names)
    rt.close()


def test_weight_ids_map_to_served_models(tiny_paths):
    rt = runtime_for(tiny_paths, threads=1)
    ids = rt.weight_ids()
    assert sorted(ids.values()) == ["tiny-1", "tiny-2"]
    wid = next(w for w, n in ids.items() if n == "tiny-2")
    assert rt.model_for_weight_id(wid).weight_id == wid
    with pytest.raises(ModelNotFoundError, match="no model with weight_id 00"):
        rt.model_for_weight_id("00" * 32)
    rt.close()


def test_a_served_catalog_sees_models_added_replaced_and_removed(tiny_paths, tmp_path, monkeypatch):
    # `ctx serve`'s catalog is live: a model written into a store or the models folder
    # after the start is served by name, one pulled again under its name replaces the
    # loaded one once nothing holds it, and one removed is gone.
    from argparse import Namespace

    from ctxengine.engine.weights import cached_weight_id
    from ctxengine.serving.catalog import catalog_from_args
    from ollama_layout import make_ollama_store, manifest_path

    monkeypatch.setattr("ctxengine.serving.catalog.RECHECK_S", 0.0)  # a known name is looked up afresh too
    store, folder = tmp_path / "ollama", tmp_path / "models"
    store.mkdir(), folder.mkdir()
    args = Namespace(model=[], models_dir=str(folder), ollama_models=[str(store)], no_ollama=False)
    runtime = Runtime(catalog_from_args(args), threads=1)
    try:
        with pytest.raises(ModelNotFoundError):
            runtime.model("m:1")
        make_ollama_store(store, "m:1", tiny_paths[0])
        first = runtime.model("m:1")
        assert first.weight_id == cached_weight_id(tiny_paths[0])
        (folder / "late.gguf").write_bytes(tiny_paths[1].read_bytes())
        assert "late" in [e.name for e in runtime.catalog.entries()]
        assert runtime.model("late").weight_id == cached_weight_id(tiny_paths[1])

        with runtime.lease("m:1"):
            make_ollama_store(store, "m:1", tiny_paths[1])  # pulled again: other weights
            assert runtime.model("m:1") is first  # a request holds it: it serves on
        second = runtime.model("m:1")
        assert second is not first and second.weight_id == cached_weight_id(tiny_paths[1])
        assert runtime.model("m:1") is second

        manifest_path(store, "m:1").unlink()
        with pytest.raises(ModelNotFoundError):
            runtime.model("m:1")
        assert "m:1" not in [e.name for e in runtime.catalog.entries()]
    finally:
        runtime.close()


def test_a_models_header_is_read_once_while_its_file_is_unchanged(tiny_paths, tmp_path, monkeypatch):
    # A live catalog is built again on every change in a store; reading each model's
    # header walks its vocabulary, so it is remembered for as long as the file is the same.
    import ctxengine.engine.servable as servable

    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_paths[0].read_bytes())
    opened = []
    real = servable.open_gguf
    monkeypatch.setattr(servable, "open_gguf", lambda path, **kw: opened.append(path) or real(path, **kw))
    assert servable.unservable_reason(copy) is None and servable.unservable_reason(copy) is None
    assert opened == [copy]
    copy.write_bytes(b"GGUF" + bytes(20))  # another file now: read again, and refused
    assert "GGUF" in (servable.unservable_reason(copy) or "") and len(opened) == 2


def test_a_models_folder_removed_while_serving_keeps_the_list(tiny_paths, tmp_path):
    import shutil
    from argparse import Namespace

    from ctxengine.serving.catalog import catalog_from_args

    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "kept.gguf").write_bytes(tiny_paths[0].read_bytes())
    catalog = catalog_from_args(Namespace(model=[], models_dir=str(folder), ollama_models=[], no_ollama=True))
    assert "kept" in [e.name for e in catalog.entries()]
    shutil.rmtree(folder)  # the folder is gone: the rebuild fails, the list stays (no 404 on every name)
    assert "kept" in [e.name for e in catalog.entries()] and catalog.lookup("kept") is not None


def test_a_delete_keeps_the_blobs_a_manifest_it_cannot_read_may_need(tiny_paths, tmp_path):
    # Blobs no manifest names are dropped after a delete; while one manifest cannot be read
    # (another tool's, a newer format), none is: that one may name them.
    from argparse import Namespace

    from ctxengine.serving.catalog import catalog_from_args
    from ctxengine.serving.pulls import delete_model
    from ollama_layout import file_sha256, make_ollama_store, manifest_path

    store = tmp_path / "ollama"
    make_ollama_store(store, "a:1", tiny_paths[0])
    make_ollama_store(store, "b:1", tiny_paths[1])
    runtime = Runtime(catalog_from_args(Namespace(model=[], models_dir=None, ollama_models=[str(store)],
                                                  no_ollama=False)), threads=1)
    try:
        manifest_path(store, "b:1").write_text("{ not json")
        blobs = {p.name for p in (store / "blobs").iterdir()}
        delete_model(runtime, "a:1")
        assert {p.name for p in (store / "blobs").iterdir()} == blobs and not manifest_path(store, "a:1").exists()
        make_ollama_store(store, "b:1", tiny_paths[1])  # readable again: a delete drops its blobs
        weights = store / "blobs" / f"sha256-{file_sha256(tiny_paths[1])}"
        assert weights.is_file()
        delete_model(runtime, "b:1")
        assert not weights.exists() and not list(store.rglob("manifests/*/*/*/*"))
    finally:
        runtime.close()


def test_the_models_folder_is_listed_again_only_where_it_changed(tiny_paths, tmp_path, monkeypatch):
    # Each look walked all of --models-dir (rglob): a large tree cost 0.5 s a request.
    import ctxengine.serving.catalog as catalog

    root = tmp_path / "models"
    for i in range(5):
        (root / f"d{i}" / "deep").mkdir(parents=True)
    (root / "d0" / "a.gguf").write_bytes(b"x")
    listed = []
    real = catalog._list
    monkeypatch.setattr(catalog, "_list", lambda folder: listed.append(folder) or real(folder))
    tree = catalog._Tree()
    assert tree.ggufs(root) == [root / "d0" / "a.gguf"] and len(listed) == 11
    listed.clear()
    assert tree.ggufs(root) == [root / "d0" / "a.gguf"] and listed == []  # nothing changed: stats only
    (root / "d3" / "deep" / "b.gguf").write_bytes(b"y")
    (root / "d0" / "a.gguf").unlink()
    assert tree.ggufs(root) == [root / "d3" / "deep" / "b.gguf"]
    assert sorted(listed) == sorted([str(root / "d0"), str(root / "d3" / "deep")])
