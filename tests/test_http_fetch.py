"""engine/http_fetch.py, against the loopback Hub: a token follows a redirect
only to the same host, and an HTTP error reaches the caller to word."""
import hashlib
import urllib.error

import pytest

from ctxengine.engine.http_fetch import fetch
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
