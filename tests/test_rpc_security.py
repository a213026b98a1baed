"""Authentication, TLS and limits of the gRPC face, on a real `ctx serve`."""
import os
import random
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from ctxengine.rpc import Remote, RemoteError
from ctxengine.rpc.v1 import snapshot_pb2 as pb
from ctxengine.store import Store, page_key
from ctxengine.store import pages as codec
from servers import CtxServer, ctx

TOKEN = "s3cret-token-for-tests"
MAX_PAGES = 64


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    assert shutil.which("openssl"), "the TLS test makes its certificate with openssl: install it"
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", d / "key.pem", "-out", d / "cert.pem", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tls):
    cert, key = tls
    # the token comes from the environment here; `--token` would do the same
    s = CtxServer(tmp_path_factory.mktemp("rpc-secure"), "--tls-cert", str(cert), "--tls-key", str(key),
                  "--max-pages", str(MAX_PAGES), "--max-message-mb", "1", env={"CTX_TOKEN": TOKEN})
    yield s
    s.stop()


def _state(store_dir):
    with Store(store_dir) as s:
        return set(s.page_keys()), set(s.snapshots()), s.refs()


def _pages(n, seed=0):
    rng = random.Random(seed)
    raws = [rng.randbytes(20000) for _ in range(n)]
    return [pb.Page(key=bytes.fromhex(page_key(r)), record=codec.encode(r)) for r in raws]


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", ""])
def test_calls_without_the_right_token_are_refused_and_store_nothing(server, tls, token, monkeypatch):
    monkeypatch.delenv("CTX_TOKEN", raising=False)
    before = _state(server.store)
    with Remote(server.target, token=token, tls=tls[0]) as r:
        for call in (lambda: r.models(),
                     lambda: r.client_stream("snapshots", "PutPages", _pages(2)),
                     lambda: r.create("intruder"),
                     lambda: list(r.stream("snapshots", "GetPages", pb.GetPagesRequest()))):
            with pytest.raises(RemoteError) as e:
                call()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED, e.value
            assert "bearer token" in e.value.details
    assert _state(server.store) == before


def test_the_right_token_over_tls_works(server, tls, monkeypatch):
    monkeypatch.setenv("CTX_TOKEN", TOKEN)  # the client's default
    with Remote(server.target, tls=tls[0]) as r:
        assert len(r.models()) >= 1
        sent = r.client_stream("snapshots", "PutPages", _pages(2, seed=5))
        assert (sent.received, sent.stored) == (2, 2)
        c = r.create("ok")
        c.append("Hello")
        assert len(list(c.generate(max_tokens=3, temperature=0.0))) >= 1
        c.delete()


def test_push_and_pull_commands_take_the_token_and_ca(server, tls, tmp_path):
    with Remote(server.target, token=TOKEN, tls=tls[0]) as r:
        c = r.create("cli")
        c.append("A short context to move.")
        sid = c.snapshot(ref="cli")
    local = tmp_path / "local"
    pulled = ctx("pull", server.target, "cli", "--store", local, "--token", TOKEN, "--tls-ca", tls[0],
                 home=tmp_path / "home")
    assert pulled.returncode == 0, pulled.stderr
    pushed = ctx("push", "cli", server.target, "--as", "cli-back", "--store", local, "--token", TOKEN,
                 "--tls-ca", tls[0], home=tmp_path / "home")
    assert pushed.returncode == 0, pushed.stderr
    assert _state(server.store)[2]["cli-back"] == sid
    refused = ctx("push", "cli", server.target, "--store", local, "--tls-ca", tls[0], home=tmp_path / "home")
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_plaintext_is_refused_by_a_tls_server(server):
    with Remote(server.target, token=TOKEN) as r, pytest.raises(RemoteError) as e:
        r.models()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("call, code", [
    (lambda r: r.missing_pages(r.models().popitem()[0], [page_key(bytes([i])) for i in range(MAX_PAGES + 1)]),
     "RESOURCE_EXHAUSTED"),
    (lambda r: list(r.stream("snapshots", "GetPages", pb.GetPagesRequest(keys=[bytes(32)] * (MAX_PAGES + 1)))),
     "RESOURCE_EXHAUSTED"),
    (lambda r: r.client_stream("snapshots", "PutPages", _pages(MAX_PAGES + 1, seed=9)), "RESOURCE_EXHAUSTED"),
    (lambda r: r.client_stream("snapshots", "PutPages", [pb.Page(key=bytes(32), record=bytes(2 << 20))]),
     "RESOURCE_EXHAUSTED"),  # past --max-message-mb 1
    (lambda r: r.unary("snapshots", "SetRef", pb.SetRefRequest(name="r" * 129, snapshot_id="0" * 64)),
     "INVALID_ARGUMENT"),
    (lambda r: r.unary("snapshots", "GetRef", pb.GetRefRequest(name="_evicted/x")), "INVALID_ARGUMENT"),
    (lambda r: list(r.stream("snapshots", "GetPages", pb.GetPagesRequest(keys=[bytes(32)]))), "NOT_FOUND"),
])
def test_limits_and_bad_names_are_refused(server, tls, call, code):
    before = _state(server.store)
    with Remote(server.target, token=TOKEN, tls=tls[0]) as r, pytest.raises(RemoteError) as e:
        call(r)
    assert e.value.code.name == code, e.value
    assert _state(server.store) == before


def test_the_server_listens_on_loopback_only_by_default(server):
    port = f"{server.port:04X}"
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and local.endswith(":" + port):  # 0A: LISTEN
                    listening.append(local.split(":")[0])
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    assert listening and set(listening) <= loopback, listening  # 127.0.0.1, ::1, ::ffff:127.0.0.1
