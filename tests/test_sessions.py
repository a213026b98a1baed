"""serving/sessions.py: what both faces do to a named context, with its checks
written once: a client's names (valid, never host-local), names unique across
models, no half-made context, restores onto the served model with the
snapshot's weights, and a held context that one request has at a time."""
import threading

import pytest

from ctxengine.engine.catalog import ModelCatalog
from ctxengine.errors import ContextError, InvalidNameError, ModelNotFoundError, StoreError, WeightsNotServedError
from ctxengine.serving.runtime import Runtime
from ctxengine.store import Manifest, Store, page_key
from ctxengine.store.names import is_host_local
from tiny_models import write_tiny_models


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    return write_tiny_models(tmp_path_factory.mktemp("models"))


@pytest.fixture
def runtime(tiny_paths, tmp_path):
    store = Store(tmp_path / "store")
    rt = Runtime(ModelCatalog.build(tiny_paths, packaged=False), store=store, threads=1)
    yield rt
    rt.close()
    store.close()


def test_host_local_names_are_the_ones_starting_with_an_underscore():
    assert is_host_local("_prefix/1") and is_host_local("_")
    assert not is_host_local("main") and not is_host_local("a/_b")


@pytest.mark.parametrize("call", [
    lambda s, ctx: s.create("_mine"),
    lambda s, ctx: s.find("_mine"),
    lambda s, ctx: s.fork(ctx, "_branch"),
    lambda s, ctx: s.snapshot(ctx, "_ref"),
    lambda s, ctx: s.restore("_ref", "back"),
    lambda s, ctx: s.restore("main", "_back"),
    lambda s, ctx: s.create("../up"),
])
def test_a_clients_names_are_valid_and_never_host_local(runtime, call):
    s = runtime.sessions
    ctx = s.create("main", labels={"k": "v"})
    with pytest.raises(InvalidNameError):
        call(s, ctx)
    assert [c.name for c in runtime.contexts()] == ["main"] and ctx.labels == {"k": "v"}


def test_the_servers_own_names_pass_with_client_false(runtime):
    s = runtime.sessions
    own = s.create("_responses/1", client=False)
    assert s.find("_responses/1", client=False) is own
    assert runtime.contexts() == []  # host-local: not a client's context


def test_a_name_is_refused_when_taken_on_any_model(runtime):
    s = runtime.sessions
    a = s.create("a", "tiny-1")
    with pytest.raises(ContextError, match="a context named 'a' already exists"):
        s.create("a", "tiny-2")
    with pytest.raises(ContextError, match="already exists"):
        s.fork(a, "a")
    assert s.fork(a, "").name != "a"  # no name: the table chooses one


def test_a_fill_that_fails_leaves_no_context(runtime):
    s = runtime.sessions

    def fill(ctx):
        ctx.append([1, 2, 3])
        raise ContextError("refused content")

    with pytest.raises(ContextError, match="refused content"):
        s.create("half", fill=fill)
    with pytest.raises(ContextError, match="no context named 'half'"):
        s.find("half")


def test_a_restore_goes_onto_the_model_with_the_snapshots_weights(runtime):
    s = runtime.sessions
    ctx = s.create("conv", "tiny-2", fill=lambda c: c.append([5, 6, 7, 8, 9]))
    snap = s.snapshot(ctx, "conv", {"note": "x"})
    assert snap.ref == "conv" and snap.n_pages >= 1 and s.published(snap) is None  # no fleet
    ctx.delete()
    runtime.unload("tiny-2")
    back = s.restore("conv", "back")  # the default model is tiny-1: the weights choose tiny-2
    assert back.weight_id == runtime.model("tiny-2").weight_id != runtime.model("tiny-1").weight_id
    assert back.tokens == [5, 6, 7, 8, 9] and back.snapshot_id == snap.snapshot_id
    assert s.loaded_entry(back).entry.name == "tiny-2"
    with pytest.raises(ContextError, match="already exists"):
        s.restore("conv", "back")


def test_a_restore_of_weights_not_served_names_what_is(runtime):
    raw = bytes(range(256)) * 16
    wid = page_key(b"weights nobody has")
    m = Manifest(weight_id=wid, model_name="alien", kv_dtype="f16", page_tokens=16, token_ids=[1] * 16,
                 page_keys=[page_key(raw)], page_size=len(raw), n_tokens=16)
    runtime.store.snapshot(m, [raw], ref="alien")
    with pytest.raises(WeightsNotServedError, match=f"no model with weight_id {wid} .*tiny-1") as err:
        runtime.sessions.restore("alien", "a")
    assert isinstance(err.value, ModelNotFoundError)  # HTTP 404, as model_for_weight_id always was


def test_snapshots_need_a_store(tiny_paths):
    rt = Runtime(ModelCatalog.build(tiny_paths, packaged=False), threads=1)
    try:
        ctx = rt.sessions.create("main")
        for call in (lambda: rt.sessions.snapshot(ctx, "main"), lambda: rt.sessions.restore("main", "b")):
            with pytest.raises(StoreError, match="this server has no snapshot store"):
                call()
    finally:
        rt.close()


def test_a_held_context_is_one_requests_until_the_block_ends(runtime):
    s = runtime.sessions
    s.create("main")
    order: list[str] = []
    held = threading.Event()

    def other():
        held.wait()
        with s.hold("main") as ctx:
            order.append("second")
            ctx.append([2])

    t = threading.Thread(target=other)
    t.start()
    with s.hold("main") as ctx:
        held.set()
        t.join(0.3)  # it waits on the context
        order.append("first")
        ctx.append([1])
    t.join(30)
    assert order == ["first", "second"] and s.find("main").tokens == [1, 2]
