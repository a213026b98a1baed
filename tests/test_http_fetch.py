"""engine/http_fetch.py, against the loopback Hub: a token follows a redirect
only to the same host, and an HTTP error reaches the caller to word; against
servers that send more or fewer bytes than declared, or another range: refused,
the partial deleted; and one pull at a time per partial file."""
import hashlib
import http.server
import threading
import urllib.error

import pytest

from ctxengine.engine.http_fetch import claimed, fetch, install
from ctxengine.errors import CorruptDataError, CtxError
from hub_servers import FakeHub


@pytest.fixture(scope="module")
def hub(smollm2_path):
    server = FakeHub({"org/repo": {"model.gguf": smollm2_path}})
    yield server
    server.close()


def test_token_is_not_sent_to_the_host_a_redirect_names(hub, tmp_path, smollm2_path):
    # resolve/ on 127.0.0.1 answers 302 to the "CDN" on localhost: another host
    got = fetch(f"{hub.url}/org/repo/resolve/main/model.gguf", tmp_path / "f", hashlib.sha256(), 0, size=None,
                headers={"Authorization": "Bearer hf_secret"}, progress=lambda n: None)
    assert got.sha256 == hashlib.sha256(smollm2_path.read_bytes()).hexdigest() and got.kept == 0
    seen = dict(hub.requests[-2:])
    assert seen["/org/repo/resolve/main/model.gguf"] == "Bearer hf_secret"
    assert seen[f"/cdn/{got.sha256}"] is None


def test_http_error_reaches_the_caller(hub, tmp_path):
    with pytest.raises(urllib.error.HTTPError) as err:
        fetch(f"{hub.url}/org/repo/resolve/main/absent.gguf", tmp_path / "f", hashlib.sha256(), 0, size=None,
              headers={}, progress=lambda n: None)
    assert err.value.code == 404


# -- servers that do not keep to what was declared: refused, nothing half-kept ---------------
class _Answer(http.server.BaseHTTPRequestHandler):
    answer = None  # (status, headers, body) for the Range header asked, set by each test

    def do_GET(self):
        status, headers, body = type(self).answer(self.headers.get("Range"))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield lambda answer: setattr(_Answer, "answer", staticmethod(answer)) or f"http://127.0.0.1:{server.server_port}/b"
    server.shutdown()
    server.server_close()


def whole(data: bytes):
    return lambda rng: (200, {"Content-Length": str(len(data))}, data)


def get(url, partial, size, kept=0):
    h = hashlib.sha256(partial.read_bytes()[:kept]) if kept else hashlib.sha256()
    return fetch(url, partial, h, kept, size=size, headers={}, progress=lambda n: None)


@pytest.mark.parametrize("length", [True, False])
def test_more_bytes_than_declared_are_refused_at_the_first_extra_one(serve, tmp_path, length):
    data = bytes(range(256)) * 4096  # 1 MiB where 5,000 bytes were declared
    url = serve(lambda rng: (200, {"Content-Length": str(len(data))} if length else {}, data))
    with pytest.raises(CorruptDataError, match="sent more than the 5000 bytes declared for it; the partial "
                                               "download was deleted"):
        get(url, tmp_path / "p", 5000)
    assert not (tmp_path / "p").exists()


def test_fewer_bytes_than_declared_in_a_whole_answer_are_refused(serve, tmp_path):
    url = serve(whole(b"x" * 4000))
    with pytest.raises(CorruptDataError, match="has 4000 bytes, not the 5000 declared for it"):
        get(url, tmp_path / "p", 5000)
    assert not (tmp_path / "p").exists()


def test_a_range_answered_from_elsewhere_or_refused_deletes_the_partial(serve, tmp_path):
    data = b"0123456789" * 100
    partial = tmp_path / "p"
    partial.write_bytes(data[:300])
    url = serve(lambda rng: (206, {"Content-Range": "bytes 0-999/1000", "Content-Length": "1000"}, data))
    with pytest.raises(CorruptDataError, match="answered the range from byte 300 with bytes from 0"):
        get(url, partial, 1000, kept=300)
    assert not partial.exists()
    partial.write_bytes(data[:300])
    url = serve(lambda rng: (416, {"Content-Length": "0"}, b""))
    with pytest.raises(CorruptDataError, match="416 .* not the start of its file"):
        get(url, partial, 1000, kept=300)
    assert not partial.exists()


def test_a_second_pull_of_the_same_file_is_told_one_is_running(tmp_path):
    partial, final = tmp_path / "blob-partial", tmp_path / "blob"
    with claimed(partial, final):
        partial.write_bytes(b"half")
        with pytest.raises(CtxError, match="another pull is downloading blob into .* right now"):
            with claimed(partial, final):
                pass
        with pytest.raises(CtxError, match="another pull is downloading m.gguf of org/repo into"):
            with claimed(partial, final, "m.gguf of org/repo"):  # the model's file, not the blob's hash
                pass
        assert partial.read_bytes() == b"half"  # untouched by the refused one
    with claimed(partial, final):  # free again once the first is done
        pass
    assert partial.read_bytes() == b"half"
    empty = tmp_path / "other-partial"
    with claimed(empty, tmp_path / "other"):
        pass
    assert not empty.exists()  # a claim that wrote nothing leaves nothing


def test_a_partial_that_changed_on_disk_is_not_renamed_into_place(tmp_path):
    partial, final = tmp_path / "p", tmp_path / "f"
    partial.write_bytes(b"x" * 10)
    with pytest.raises(CorruptDataError, match="holds 10 bytes on disk, not the 12 that were verified"):
        install(partial, final, 12, "blob")
    assert not partial.exists() and not final.exists()
    partial.write_bytes(b"x" * 12)
    install(partial, final, 12, "blob")
    assert final.read_bytes() == b"x" * 12 and not partial.exists()


def test_a_server_that_ignores_the_range_and_breaks_off_is_not_asked_forever(serve, tmp_path, monkeypatch):
    # Each answer starts again at byte 0 (200, Range ignored) and closes after 64 KiB of 1 MiB:
    # every request moved bytes, and the retries started afresh each time, without end.
    from ctxengine.engine import http_fetch
    monkeypatch.setattr(http_fetch.time, "sleep", lambda s: None)
    data = bytes(range(256)) * 4096
    asked = []
    url = serve(lambda rng: asked.append(rng) or (200, {"Content-Length": str(len(data))}, data[: 64 << 10]))
    with pytest.raises(CtxError, match="broke off"):
        get(url, tmp_path / "p", len(data))
    assert len(asked) == http_fetch.RETRIES + 1 and asked[0] is None and set(asked[1:]) == {"bytes=65536-"}


def test_a_server_that_breaks_off_but_keeps_the_range_is_followed_to_the_end(serve, tmp_path, monkeypatch):
    from ctxengine.engine import http_fetch
    monkeypatch.setattr(http_fetch.time, "sleep", lambda s: None)
    data = bytes(range(256)) * 1024  # 256 KiB in 16 pieces: more breaks than RETRIES, each one further on

    def piece(rng):
        start = int(rng[6:-1]) if rng else 0
        head = {"Content-Length": str(len(data) - start)} | ({"Content-Range": f"bytes {start}-{len(data) - 1}/"
                                                              f"{len(data)}"} if start else {})
        return (206 if start else 200), head, data[start:start + (16 << 10)]
    url = serve(piece)
    got = get(url, tmp_path / "p", len(data))
    assert got.sha256 == hashlib.sha256(data).hexdigest() and (tmp_path / "p").read_bytes() == data
