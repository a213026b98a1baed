"""ContextService against a real `ctx serve` on loopback, compared with the local engine."""
import threading
import time

import grpc
import pytest

import ctxengine as ce
from ctxengine.errors import ContextError
from ctxengine.rpc import Remote, RemoteError
from servers import CtxServer

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = CtxServer(tmp_path_factory.mktemp("rpc-contexts"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote(server):
    with Remote(server.target) as r:
        yield r


@pytest.fixture(scope="module")
def local(smollm2_path):
    model = ce.load(smollm2_path)
    yield model
    model.close()


def _local_run(model, name, prompt, n, **sampling):
    c = model.context(name)
    c.append(prompt)
    pieces = list(c.generate(max_tokens=n, **sampling))
    out = [p.token_id for p in pieces], "".join(p.text for p in pieces), c.finish_reason, c.tokens
    c.delete()
    return out


def test_generate_streams_what_the_local_engine_generates(remote, local):
    c = remote.create("greedy")
    assert c.append(PROMPT) > 0
    pieces = list(c.generate(max_tokens=12, temperature=0.0))
    ids, text, finish, tokens = _local_run(local, "greedy", PROMPT, 12, temperature=0.0)
    assert [p.token_id for p in pieces] == ids and "".join(p.text for p in pieces) == text
    assert c.finish_reason == finish
    assert c.tokens == tokens
    assert c.usage.prompt_tokens + c.usage.completion_tokens == c.usage.n_tokens == len(tokens)


def test_seeded_sampling_is_the_same_remotely(remote, local):
    c = remote.create("seeded")
    c.append(PROMPT)
    remote_ids = [p.token_id for p in c.generate(max_tokens=10, temperature=0.9, seed=5)]
    # no seed: the RNG goes on from where the last generation left it
    remote_ids += [p.token_id for p in c.generate(max_tokens=6, temperature=0.9)]
    lc = local.context("seeded")
    lc.append(PROMPT)
    local_ids = [p.token_id for p in lc.generate(max_tokens=10, temperature=0.9, seed=5)]
    local_ids += [p.token_id for p in lc.generate(max_tokens=6, temperature=0.9)]
    lc.delete()
    assert remote_ids == local_ids


def test_system_prompt_is_rendered_with_the_chat_template(remote, local):
    c = remote.create("sys", system="You are terse.", labels={"who": "test"})
    want = local.tokenize(local.chat_prompt([{"role": "system", "content": "You are terse."}],
                                            add_generation_prompt=False), parse_special=True)
    assert c.tokens == want and c.labels == {"who": "test"} and c.weight_id == local.weight_id
    assert c.model == "smollm2"


def test_token_ids_fork_rewind_snapshot_restore_delete(remote, local):
    ids = local.tokenize(PROMPT)
    c = remote.create("tree")
    assert c.append(ids) == len(ids)
    b = c.fork("tree-b")
    b.rewind(2)
    assert b.tokens == ids[:-2] and c.tokens == ids
    b.append(ids[-2:])
    sid = b.snapshot(ref="tree-b", labels={"step": "1"})
    assert remote.refs()["tree-b"] == sid and b.snapshot_id == sid
    sid_tree = c.snapshot()  # no ref given: the context's own name
    assert remote.refs()["tree"] == sid_tree
    r = remote.restore("tree-b", name="tree-c")
    assert r.tokens == ids and r.snapshot_id == sid and r.labels == {"step": "1"}
    # the same tokens give the same continuation, whichever way they came
    outs = [[p.token_id for p in x.generate(max_tokens=6, temperature=0.0)] for x in (c, b, r)]
    assert outs[0] == outs[1] == outs[2]
    assert {"tree", "tree-b", "tree-c"} <= {x.name for x in remote.contexts()}
    r.delete()
    with pytest.raises(RemoteError) as e:
        remote.context("tree-c")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "tree-c" not in {x.name for x in remote.contexts()}


def test_a_cancelled_stream_stops_generating_and_frees_the_context(remote):
    c = remote.create("cancel")
    c.append("Once upon a time")
    n0 = c.n_tokens
    stream = c.generate(max_tokens=2000, temperature=0.8, seed=1)
    for _ in range(3):
        next(stream)
    stream.close()  # cancels the call
    time.sleep(0.3)
    after = c.refresh().n_tokens
    time.sleep(0.5)
    assert c.refresh().n_tokens == after <= n0 + 5  # stopped, not still sampling
    t0 = time.monotonic()
    c.append(" The end.")  # the context's lock was released
    assert time.monotonic() - t0 < 5


def test_many_clients_at_once_get_what_each_would_alone(server, local):
    prompts = [f"{PROMPT} {w}" for w in ("red", "blue", "and", "not")]
    want = [_local_run(local, f"alone-{i}", p, 16, temperature=0.0)[0] for i, p in enumerate(prompts)]
    got, errors = [None] * len(prompts), []

    def client(i):
        try:
            with Remote(server.target) as r:  # its own connection
                c = r.create(f"many-{i}")
                c.append(prompts[i])
                got[i] = [p.token_id for p in c.generate(max_tokens=16, temperature=0.0)]
        except Exception as err:  # reported below, not lost in the thread
            errors.append(err)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and got == want


@pytest.mark.parametrize("call, code", [
    (lambda r: r.context("no-such"), "NOT_FOUND"),
    (lambda r: r.create("dup"), "ALREADY_EXISTS"),
    (lambda r: r.create("../etc"), "INVALID_ARGUMENT"),
    (lambda r: r.create("x" * 129), "INVALID_ARGUMENT"),
    (lambda r: r.create("_internal"), "INVALID_ARGUMENT"),
    (lambda r: r.create(model="no-such-model"), "NOT_FOUND"),
    (lambda r: r.restore("no-such-ref"), "NOT_FOUND"),
    (lambda r: r.context("dup").append([10 ** 6]), "INVALID_ARGUMENT"),
    (lambda r: list(r.create("empty").generate(4)), "INVALID_ARGUMENT"),
    (lambda r: r.context("dup").rewind(10 ** 6), "INVALID_ARGUMENT"),
])
def test_bad_requests_get_clear_status_codes_and_lose_nothing(remote, call, code):
    if "dup" not in {c.name for c in remote.contexts()}:
        remote.create("dup").append(PROMPT)
    before = remote.context("dup").tokens
    try:
        with pytest.raises(RemoteError) as e:
            call(remote)
        assert e.value.code.name == code, e.value
        assert e.value.details and "Traceback" not in e.value.details
        assert remote.context("dup").tokens == before
    finally:
        if "empty" in {c.name for c in remote.contexts()}:
            remote.context("empty").delete()


def test_unknown_sampling_options_are_refused_before_the_call(remote):
    c = remote.create("opts")
    c.append(PROMPT)
    with pytest.raises(ContextError, match="unknown sampling"):
        list(c.generate(4, temprature=0.0))
