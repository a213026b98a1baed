"""The idle limit of streaming calls (`ctx serve --rpc-idle-s`, rpc/idle.py), against a real
`ctx serve` on loopback: a client that stops sending or reading is ended and frees what its
call held; one that is slow but steady, or a call that waits on the server, is not."""
import argparse
import os
import struct
import threading
import time
from concurrent import futures

import blake3
import grpc
import pytest

from ctxengine.rpc import add_grpc_arguments
from ctxengine.rpc.idle import IdleLimit
from ctxengine.rpc.v1 import context_pb2 as cpb
from ctxengine.rpc.v1 import context_pb2_grpc as cg
from ctxengine.rpc.v1 import snapshot_pb2 as spb
from ctxengine.rpc.v1 import snapshot_pb2_grpc as sg
from servers import CtxServer

IDLE_S = 1.0
ENDED_WITHIN_S = IDLE_S + 10  # the limit, then the server's own time on a loaded machine
MAX_PUT_CALLS = 8             # rpc/snapshots.py Limits
MAX_CONCURRENT_RPCS = 128     # rpc/server.py
HOT = cpb.SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=5)  # rarely ends early
# A client whose reading paces the server: with a 16-byte stream window (and no BDP probe to widen
# it) the server's next send waits until the client asks for a message, as it would on a full socket
# once a real window is full; a client that stops reading leaves that send waiting.
LAZY_READER = [("grpc.http2.lookahead_bytes", 16), ("grpc.http2.bdp_probe", 0)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = CtxServer(tmp_path_factory.mktemp("rpc-idle"), "--rpc-idle-s", str(IDLE_S))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.target) as ch:
        yield ch


@pytest.fixture(scope="module")
def lazy(server):
    with grpc.insecure_channel(server.target, options=LAZY_READER) as ch:
        yield ch


def _page(raw: bytes) -> spb.Page:
    record = struct.pack("<4sBBHI", b"CTXP", 1, 0, 0, len(raw)) + raw  # a raw (uncompressed) record
    return spb.Page(key=blake3.blake3(raw).digest(), record=record)


def _stalled(stop: threading.Event, first: spb.Page):
    """A request stream that sends ``first`` and then nothing until ``stop``."""
    yield first
    stop.wait()


def _nothing(stop: threading.Event):
    """A request stream that opens the call and sends nothing until ``stop``."""
    stop.wait()
    yield from ()


def _steady(pages: list[spb.Page], gap_s: float):
    """A slow sender that is never silent for long: one page every ``gap_s``."""
    for page in pages:
        time.sleep(gap_s)
        yield page


def _missing(snapshots, keys: list[bytes]) -> list[bytes]:
    wid = snapshots.Models(spb.ModelsRequest()).models[0].weight_id
    return list(snapshots.MissingPages(spb.MissingPagesRequest(weight_id=wid, keys=keys)).missing)


def _assert_ended_idle(err: grpc.RpcError, what: str) -> None:
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
    assert f"did not {what} a message for {IDLE_S:g} s" in err.details() and "--rpc-idle-s" in err.details()


# -- the flag ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x", ""])
def test_the_idle_limit_is_a_finite_number_of_seconds(value, capsys):
    p = argparse.ArgumentParser(prog="ctx serve")
    add_grpc_arguments(p)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--rpc-idle-s", value])
    assert e.value.code == 2 and "argument --rpc-idle-s" in capsys.readouterr().err
    assert p.parse_args([]).rpc_idle_s == 60 and p.parse_args(["--rpc-idle-s", "0"]).rpc_idle_s == 0


# -- a client that goes silent -------------------------------------------------------------------
def test_a_put_pages_sender_that_stalls_is_ended_and_its_slot_freed(channel):
    snapshots = sg.SnapshotServiceStub(channel)
    stop = threading.Event()
    firsts = [_page(os.urandom(512)) for _ in range(MAX_PUT_CALLS)]
    stalled = [snapshots.PutPages.future(_stalled(stop, p)) for p in firsts]  # every put slot taken
    try:
        for f in stalled:
            with pytest.raises(grpc.RpcError) as e:
                f.result(timeout=ENDED_WITHIN_S)
            _assert_ended_idle(e.value, "send")
    finally:
        stop.set()
    pushes = [[_page(os.urandom(512)) for _ in range(2)] for _ in range(MAX_PUT_CALLS + 1)]
    done = [snapshots.PutPages.future(_steady(pages, 0.1)) for pages in pushes]
    assert [f.result(timeout=30).stored for f in done] == [2] * len(done)
    assert _missing(snapshots, [p.key for p in firsts]) == [p.key for p in firsts]  # nothing of theirs kept


def _stop_reading(lazy, request: spb.GetPagesRequest, n: int) -> list:
    """``n`` GetPages calls that each take their first page and then stop reading: each
    leaves the server's thread blocked in the send of the next."""
    calls = [sg.SnapshotServiceStub(lazy).GetPages(request) for _ in range(n)]
    for call in calls:
        assert next(call).key == request.keys[0]
    return calls


def test_get_pages_clients_that_stop_reading_are_ended_and_free_their_threads(channel, lazy):
    snapshots = sg.SnapshotServiceStub(channel)
    page = _page(os.urandom(16 << 10))
    snapshots.PutPages(iter([page]), timeout=30)
    request = spb.GetPagesRequest(keys=[page.key] * 32)
    calls = _stop_reading(lazy, request, MAX_CONCURRENT_RPCS)  # as many as the server runs at once
    stalled_at = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        snapshots.Models(spb.ModelsRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, "the sends did not block: nothing to test"
    time.sleep(max(0.0, stalled_at + IDLE_S + 1 - time.monotonic()))  # reading sooner would save a call
    for call in calls:  # each ends, after the pages that reached the client before it stopped reading
        with pytest.raises(grpc.RpcError) as e:
            assert all(p.key == page.key for p in call)
        _assert_ended_idle(e.value, "take")
    time.sleep(0.2)  # a call's thread returns just after its client has the status
    again = _stop_reading(lazy, request, MAX_CONCURRENT_RPCS)  # every thread came back
    for call in again:
        call.cancel()
    deadline = time.monotonic() + 10
    while True:  # as a client's cancel reaches the server, its thread returns
        try:
            assert snapshots.Models(spb.ModelsRequest(), timeout=10).models
            break
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
            time.sleep(0.1)
    assert len(list(snapshots.GetPages(request, timeout=30))) == 32


def test_a_generate_client_that_stops_reading_lets_go_of_the_context(channel, lazy):
    contexts = cg.ContextServiceStub(channel)
    contexts.Create(cpb.CreateRequest(name="left"))
    contexts.Append(cpb.AppendRequest(name="left", text="Once upon a time, in a land far away,"))
    stalled = cg.ContextServiceStub(lazy).Generate(cpb.GenerateRequest(name="left", max_tokens=500, sampling=HOT))
    assert next(stalled).HasField("piece")  # it holds the context's lock, and soon waits for us to read
    events = list(contexts.Generate(cpb.GenerateRequest(name="left", max_tokens=4), timeout=ENDED_WITHIN_S + 20))
    assert events[-1].HasField("done")  # it waited for the lock, and got it when the first call was ended
    with pytest.raises(grpc.RpcError) as e:
        assert not any(ev.HasField("done") for ev in stalled)
    _assert_ended_idle(e.value, "take")
    assert contexts.Get(cpb.GetRequest(name="left")).n_tokens == events[-1].done.n_tokens


def test_calls_whose_request_never_comes_are_ended(channel):
    # grpcio reads a unary request in a pool thread before any servicer code runs: a client that
    # opens a call and sends no request held that thread (and a call slot) for good.
    stop = threading.Event()
    within = ENDED_WITHIN_S  # a client's own deadline says "Deadline Exceeded", not the server's words
    silent = [channel.stream_stream("/ctxengine.v1.ContextService/Generate")(_nothing(stop), timeout=within),
              channel.stream_unary("/ctxengine.v1.ContextService/Append").future(_nothing(stop), timeout=within)]
    try:
        with pytest.raises(grpc.RpcError) as e:
            list(silent[0])
        _assert_ended_idle(e.value, "send")
        with pytest.raises(grpc.RpcError) as e:
            silent[1].result(timeout=ENDED_WITHIN_S)
        _assert_ended_idle(e.value, "send")
    finally:
        stop.set()
    with pytest.raises(grpc.RpcError) as e:  # a unary call without its request, as grpcio answers it
        channel.stream_unary("/ctxengine.v1.ContextService/List")(iter([]), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "exactly one request" in e.value.details()


# -- a client that is slow but steady, and calls that wait on the server -------------------------
def test_steady_senders_and_a_push_waiting_for_a_slot_are_not_cut(channel):
    snapshots = sg.SnapshotServiceStub(channel)
    slow = [[_page(os.urandom(512)) for _ in range(10)] for _ in range(MAX_PUT_CALLS)]
    holders = [snapshots.PutPages.future(_steady(pages, 0.3)) for pages in slow]  # 3 s each, every slot
    time.sleep(0.5)
    started = time.monotonic()
    waiter = snapshots.PutPages(iter([_page(os.urandom(512))]), timeout=30)  # waits for a slot, 2.5 s
    assert waiter.stored == 1 and time.monotonic() - started > IDLE_S
    assert [f.result(timeout=30).stored for f in holders] == [10] * MAX_PUT_CALLS


def test_a_slow_reader_and_a_generate_queued_behind_it_are_not_cut(channel, lazy):
    contexts = cg.ContextServiceStub(channel)
    contexts.Create(cpb.CreateRequest(name="slow"))
    contexts.Append(cpb.AppendRequest(name="slow", text="Once upon a time, in a land far away,"))
    first = cg.ContextServiceStub(lazy).Generate(cpb.GenerateRequest(name="slow", max_tokens=40, sampling=HOT))

    def second():
        started = time.monotonic()
        events = list(contexts.Generate(cpb.GenerateRequest(name="slow", max_tokens=4), timeout=60))
        return events, time.monotonic() - started

    events = [next(first)]  # it holds the context's lock now
    with futures.ThreadPoolExecutor(1) as pool:
        queued = pool.submit(second)
        for _ in range(10):  # 3 s in all, never a second without taking a message
            time.sleep(0.3)
            events.append(next(first))
        events += list(first)
        second_events, waited = queued.result(timeout=60)
    assert events[-1].HasField("done") and second_events[-1].HasField("done")
    assert waited > IDLE_S  # it waited on the server (the context's lock) past the limit


# -- no limit ------------------------------------------------------------------------------------
def test_an_idle_limit_of_0_never_ends_a_stream(tmp_path):
    s = CtxServer(tmp_path, "--rpc-idle-s", "0")
    try:
        with grpc.insecure_channel(s.target) as ch:
            stop = threading.Event()
            pages = [_page(os.urandom(512)) for _ in range(2)]

            def sender():
                yield pages[0]
                stop.wait()
                yield pages[1]

            call = sg.SnapshotServiceStub(ch).PutPages.future(sender())
            time.sleep(2 * IDLE_S + 0.5)
            assert not call.done()
            stop.set()
            assert call.result(timeout=30).stored == 2
    finally:
        s.stop()


# -- the watchdog itself ---------------------------------------------------------------------------
def test_one_watchdog_for_every_call_and_nothing_left_when_they_end():
    def count(requests, context):
        return str(sum(1 for _ in requests)).encode()

    def echo(request, context):
        yield from (request for _ in range(3))

    limit = IdleLimit(IDLE_S)
    handlers = grpc.method_handlers_generic_handler("t.T", {"Count": grpc.stream_unary_rpc_method_handler(count),
                                                            "Echo": grpc.unary_stream_rpc_method_handler(echo)})
    srv = grpc.server(futures.ThreadPoolExecutor(32), interceptors=[limit])
    srv.add_generic_rpc_handlers((handlers,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            counts = [ch.stream_unary("/t.T/Count").future(_steady([b"x"] * 3, 0.05)) for _ in range(20)]
            echoes = [list(ch.unary_stream("/t.T/Echo")(b"y")) for _ in range(20)]
            assert [f.result(timeout=30) for f in counts] == [b"3"] * 20 and echoes == [[b"y"] * 3] * 20
            time.sleep(0.2)  # a call's end callbacks run just after its client has the status
            assert limit.n_watched == 0
    finally:
        watchdogs = [t for t in threading.enumerate() if t.name == "ctx-grpc-idle"]
        srv.stop(None).wait()
        limit.close()
    assert len(watchdogs) == 1 and not watchdogs[0].is_alive()
