"""Faults an outside tester found in the gRPC face, each against a real `ctx serve` on loopback."""
import argparse
import os
import struct
import threading
import time

import blake3
import grpc
import pytest

from ctxengine.rpc import add_grpc_arguments
from ctxengine.rpc.v1 import context_pb2 as cpb
from ctxengine.rpc.v1 import context_pb2_grpc as cg
from ctxengine.rpc.v1 import snapshot_pb2 as spb
from ctxengine.rpc.v1 import snapshot_pb2_grpc as sg
from servers import CtxServer

PROMPT = "Once upon a time, in a land far away,"
HOT = cpb.SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=5)  # rarely ends early


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = CtxServer(tmp_path_factory.mktemp("rpc-faults"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.target) as ch:
        yield ch


@pytest.fixture(scope="module")
def contexts(channel):
    return cg.ContextServiceStub(channel)


@pytest.fixture(scope="module")
def snapshots(channel):
    return sg.SnapshotServiceStub(channel)


def _context(stub, name, text=PROMPT):
    stub.Create(cpb.CreateRequest(name=name))
    stub.Append(cpb.AppendRequest(name=name, text=text))


def _page(raw: bytes, key_of: bytes | None = None) -> spb.Page:
    record = struct.pack("<4sBBHI", b"CTXP", 1, 0, 0, len(raw)) + raw  # a raw (uncompressed) record
    return spb.Page(key=blake3.blake3(key_of if key_of is not None else raw).digest(), record=record)


def _idle(stop: threading.Event, first=None):
    """A request stream that sends ``first`` (if any) and then nothing until ``stop``."""
    if first is not None:
        yield first
    while not stop.is_set():
        time.sleep(0.05)


# -- 1. arguments ----------------------------------------------------------------------
@pytest.mark.parametrize("flag, value", [
    ("--max-message-mb", "nan"), ("--max-message-mb", "inf"), ("--max-message-mb", "0"),
    ("--max-message-mb", "-1"), ("--max-message-mb", "x"), ("--max-message-mb", "4096"),
    ("--max-pages", "0"), ("--max-pages", "-5"), ("--max-pages", "1.5"),
])
def test_grpc_limits_must_be_finite_and_positive(flag, value, capsys):
    p = argparse.ArgumentParser(prog="ctx serve")
    add_grpc_arguments(p)
    with pytest.raises(SystemExit) as e:
        p.parse_args([flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err


def test_reasonable_grpc_limits_are_accepted():
    p = argparse.ArgumentParser()
    add_grpc_arguments(p)
    args = p.parse_args(["--max-message-mb", "0.5", "--max-pages", "10"])
    assert args.max_message_mb == 0.5 and args.max_pages == 10


# -- 2, 3. Generate on a shared context -----------------------------------------------------
def test_a_generate_cancelled_while_queued_takes_nothing_into_the_context(contexts):
    _context(contexts, "queued")
    first = contexts.Generate(cpb.GenerateRequest(name="queued", max_tokens=600, sampling=HOT))
    next(first)  # it holds the context's lock now
    second = contexts.Generate(cpb.GenerateRequest(name="queued", max_tokens=50, sampling=HOT))
    time.sleep(0.3)
    second.cancel()
    cancelled_at = time.monotonic()
    done = [ev.done for ev in first if ev.HasField("done")][0]
    assert time.monotonic() > cancelled_at + 0.2, "the first call ended too soon to queue the second"
    with pytest.raises(grpc.RpcError) as e:
        list(second)
    assert e.value.code() == grpc.StatusCode.CANCELLED
    time.sleep(0.5)
    assert contexts.Get(cpb.GetRequest(name="queued")).n_tokens == done.n_tokens


def test_done_counts_only_its_own_tokens_when_calls_share_a_context(contexts):
    _context(contexts, "shared")
    out = {}

    def gen(i):
        events = list(contexts.Generate(cpb.GenerateRequest(
            name="shared", max_tokens=20, sampling=cpb.SamplingParams(temperature=1.0, seed=i))))
        out[i] = sum(ev.HasField("piece") and ev.piece.HasField("token_id") for ev in events), events[-1].done

    threads = [threading.Thread(target=gen, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for streamed, done in out.values():
        assert done.completion_tokens in (streamed, streamed + 1)  # + an end of turn, not streamed
        assert done.prompt_tokens + done.completion_tokens == done.n_tokens
    assert sorted(d.n_tokens for _, d in out.values())[-1] == contexts.Get(cpb.GetRequest(name="shared")).n_tokens


# -- 4, 5. PutPages -------------------------------------------------------------------------
def test_a_bad_record_refuses_the_call_even_when_a_good_one_follows_under_its_key(snapshots):
    good = os.urandom(1000)
    bad = _page(os.urandom(1000), key_of=good)  # fails verification against its key
    with pytest.raises(grpc.RpcError) as e:
        snapshots.PutPages(iter([bad, _page(good)]), timeout=30)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DATA_LOSS)
    assert "nothing from this call was stored" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:  # the other order
        snapshots.PutPages(iter([_page(good), bad]), timeout=30)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DATA_LOSS)


def test_silent_put_pages_calls_hold_no_buffer_slot(snapshots):
    stop = threading.Event()
    idle = [snapshots.PutPages.future(_idle(stop)) for _ in range(8)]
    try:
        time.sleep(0.5)
        r = snapshots.PutPages(iter([_page(os.urandom(4096))]), timeout=10)
        assert (r.received, r.stored) == (1, 1)
    finally:
        stop.set()
        for f in idle:
            f.cancel()


def test_a_put_pages_cancelled_while_waiting_for_a_slot_gives_it_up(snapshots):
    stop = threading.Event()
    holders = [snapshots.PutPages.future(_idle(stop, _page(os.urandom(256)))) for _ in range(8)]
    try:
        time.sleep(0.5)
        waiter = snapshots.PutPages.future(iter([_page(os.urandom(256))]))
        time.sleep(0.5)
        assert not waiter.done()  # every slot is held by a call that has buffered a page
        waiter.cancel()
    finally:
        stop.set()
    for f in holders:
        assert f.result(timeout=10).received == 1
    r = snapshots.PutPages(iter([_page(os.urandom(256))]), timeout=10)
    assert r.received == 1


# -- 6. status codes ------------------------------------------------------------------------
@pytest.mark.parametrize("call, code", [
    (lambda c, s: list(c.Generate(cpb.GenerateRequest(name="codes", max_tokens=2, stop=[""]))), "INVALID_ARGUMENT"),
    (lambda c, s: s.GetManifest(spb.GetManifestRequest(ref="")), "INVALID_ARGUMENT"),
    (lambda c, s: s.SetRef(spb.SetRefRequest(name="r", snapshot_id="zz")), "INVALID_ARGUMENT"),
    (lambda c, s: s.SetRef(spb.SetRefRequest(name="r", snapshot_id="0" * 64)), "NOT_FOUND"),
])
def test_status_codes_are_the_documented_ones(contexts, snapshots, call, code):
    if "codes" not in {c.name for c in contexts.List(cpb.ListRequest()).contexts}:
        _context(contexts, "codes", "Hello")
    with pytest.raises(grpc.RpcError) as e:
        call(contexts, snapshots)
    assert e.value.code().name == code, e.value.details()


# -- 7. idle streams ------------------------------------------------------------------------
def test_idle_streaming_calls_do_not_stall_the_server(snapshots):
    stop = threading.Event()
    idle = [snapshots.PutPages.future(_idle(stop)) for _ in range(40)]
    try:
        time.sleep(0.5)
        assert snapshots.Models(spb.ModelsRequest(), timeout=10).models
    finally:
        stop.set()
        for f in idle:
            f.cancel()


def test_an_append_whose_client_cancels_stops_its_prefill_and_adds_nothing(contexts):
    # a cancelled unary Append prefilled to its end (seconds of both cores for nobody), and kept it
    contexts.Create(cpb.CreateRequest(name="long-append"))
    call = contexts.Append.future(cpb.AppendRequest(name="long-append", text="a story of the sea " * 1500))
    time.sleep(0.5)
    assert call.cancel()
    t = time.monotonic()
    after = contexts.Append(cpb.AppendRequest(name="long-append", text="The end."))  # waits for the context
    assert time.monotonic() - t < 4  # the scheduler's next step, not the 6,000-token prompt's end
    assert after.context.n_tokens == after.n_new  # nothing of the cancelled text stayed
