"""ctx pull ollama://...: the registry's manifest and blob protocol from a
loopback registry serving the real SmolLM2 and Gemma 3, into an Ollama-layout
store; resumed after a kill, a tampered blob refused, errors that say why."""
import json
import os

import pytest

from ctxengine.ollama.store import find_ollama_model
from hub_servers import FakeRegistry, RegistryHandler, sha256_of
from pull_fixtures import kill_halfway, make_registry, pull, server_set


@pytest.fixture(scope="module")
def registry(smollm2_path, gemma3_path, tmp_path_factory):
    server = make_registry(tmp_path_factory.mktemp("registry"), smollm2_path, gemma3_path)
    yield server
    server.close()


def env_for(registry) -> dict:
    return {"CTX_OLLAMA_REGISTRY": registry.url}


def test_pull_writes_the_ollama_layout_with_every_layer(registry, tmp_path):
    before = registry.sent
    r = pull("ollama://smollm2:135m", home=tmp_path, env=env_for(registry))
    assert r.returncode == 0, r.stderr
    store = tmp_path / "ollama"
    manifest = store / "manifests/registry.ollama.ai/library/smollm2/135m"
    assert manifest.read_bytes() == next(registry.root.glob("manifests/*/library/smollm2/135m")).read_bytes()
    layers = json.loads(manifest.read_bytes())["layers"]
    assert {l["mediaType"].rsplit(".", 1)[-1] for l in layers} == {"model", "template", "system", "params"}
    for layer in [json.loads(manifest.read_bytes())["config"], *layers]:
        blob = store / "blobs" / layer["digest"].replace(":", "-")
        assert blob.read_bytes() == (registry.root / "blobs" / blob.name).read_bytes()
    assert not list(store.glob("blobs/*-partial"))
    entry = find_ollama_model("smollm2:135m", [store])
    assert entry.servable and entry.system == "You are terse." and entry.params["stop"] == ["<|im_end|>"]
    assert r.stdout.strip() == str(entry.path)
    assert registry.sent - before == sum(l["size"] for l in layers) + json.loads(manifest.read_bytes())["config"]["size"]
    listed = pull_list(tmp_path)
    assert "smollm2:135m" in listed and "cannot be served" not in listed.split("smollm2:135m")[1].split("\n")[0]
    again = registry.sent
    r = pull("ollama://smollm2:135m", home=tmp_path, env=env_for(registry))
    assert r.returncode == 0 and "nothing fetched" in r.stderr and registry.sent == again


def pull_list(home) -> str:
    from servers import ctx
    r = ctx("models", "list", home=home)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_killed_pull_resumes_where_it_stopped(registry, tmp_path, gemma3_path):
    registry.rate = 40e6  # bytes a second, so the kill lands halfway
    try:
        kept = kill_halfway("ollama://gemma3:270m", "ollama/blobs/*-partial", tmp_path, home=tmp_path,
                            env=env_for(registry), at=30 << 20)
    finally:
        registry.rate = None
    size = gemma3_path.stat().st_size
    assert 0 < kept < size
    assert not (tmp_path / "ollama/manifests").exists()  # no manifest names a blob it lacks
    before = registry.sent
    r = pull("ollama://gemma3:270m", home=tmp_path, env=env_for(registry))
    assert r.returncode == 0, r.stderr
    fetched = registry.sent - before
    assert fetched < size and fetched <= size - kept + (1 << 20)  # only the rest, and the small layers
    assert "resumed from an earlier pull" in r.stderr
    entry = find_ollama_model("gemma3:270m", [tmp_path / "ollama"])
    assert entry.servable and entry.path.stat().st_size == size


def test_blob_broken_off_is_asked_again_from_where_it_stopped(registry, tmp_path, smollm2_path):
    size = smollm2_path.stat().st_size
    before = registry.sent
    with server_set(registry, break_at=size // 3):  # the model blob breaks off once, a third of the way
        r = pull("ollama://smollm2:135m", home=tmp_path, env=env_for(registry))
    assert r.returncode == 0, r.stderr
    assert "broke off" in r.stderr and registry.sent - before < size + (1 << 20)  # the small layers, no byte twice
    assert find_ollama_model("smollm2:135m", [tmp_path / "ollama"]).path.read_bytes() == smollm2_path.read_bytes()


def test_tampered_blob_is_refused_and_deleted(registry, tmp_path, smollm2_path):
    from hub_servers import sha256_of
    digest = sha256_of(smollm2_path)
    registry.tamper.add(digest)
    try:
        r = pull("ollama://smollm2:135m", home=tmp_path, env=env_for(registry))
    finally:
        registry.tamper.discard(digest)
    assert r.returncode == 1
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("ctx pull: error: ") and "sha256" in error and "partial download was deleted" in error
    assert not (tmp_path / "ollama/blobs" / f"sha256-{digest}").exists()
    assert not list((tmp_path / "ollama/blobs").glob("*-partial"))
    assert not (tmp_path / "ollama/manifests").exists()


def test_wrong_name_and_private_model_say_which(registry, tmp_path):
    r = pull("ollama://nosuch:7b", home=tmp_path, env=env_for(registry))
    assert r.returncode == 1 and "nosuch:7b not found" in r.stderr and "check the name" in r.stderr
    r = pull("ollama://secret/model:1", home=tmp_path, env=env_for(registry))
    assert r.returncode == 1 and "wants a token" in r.stderr


def test_explicit_host_and_ollama_models_store(registry, tmp_path):
    host = registry.url.removeprefix("http://")
    store = tmp_path / "ollama-models"
    r = pull(f"ollama://{host}/library/smollm2:135m", "--ollama-models", home=tmp_path / "home",
             env={"OLLAMA_MODELS": str(store)})
    assert r.returncode == 0, r.stderr
    assert (store / "manifests" / host / "library/smollm2/135m").is_file()
    assert find_ollama_model(f"{host}/library/smollm2:135m", [store]).servable


def test_unreachable_registry_says_what_is_stored(tmp_path):
    from servers import free_port
    r = pull("ollama://smollm2:135m", home=tmp_path, env={"CTX_OLLAMA_REGISTRY": f"http://127.0.0.1:{free_port()}"})
    assert r.returncode == 1 and "cannot reach the registry" in r.stderr and "holds no models yet" in r.stderr


def test_full_disk_and_unwritable_store_are_named(registry, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from ctxengine.errors import CtxError
    from ctxengine.ollama.registry_pull import pull_ollama

    monkeypatch.setenv("CTX_OLLAMA_REGISTRY", registry.url)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(CtxError, match=r"disk full: the pull needs \d+ more bytes, .* has 1048576 free"):
        pull_ollama("smollm2:135m", store=tmp_path / "store")
    monkeypatch.undo()
    monkeypatch.setenv("CTX_OLLAMA_REGISTRY", registry.url)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(CtxError, match="cannot write into .*file/blobs"):
        pull_ollama("smollm2:135m", store=tmp_path / "file")
    assert not list((tmp_path / "store").rglob("*-partial")) and not (tmp_path / "store" / "manifests").exists()


@pytest.mark.parametrize("digest", ["sha256:" + "AB" * 32, "sha256:" + "ab" * 32 + "\n", "sha256:../" + "a" * 61,
                                    "sha256-" + "ab" * 32, "sha512:" + "ab" * 32])
def test_a_layer_digest_a_registry_would_not_write_is_refused(digest):
    from ctxengine.errors import CtxError
    from ctxengine.ollama.registry_pull import _blobs_of
    from ctxengine.ollama.store import parse_model_name

    raw = json.dumps({"layers": [{"digest": digest, "size": 10}]}).encode()
    with pytest.raises(CtxError, match=r"without a sha256 digest \(sha256:<64 lowercase hex>\)"):
        _blobs_of(raw, parse_model_name("m:1"))
    assert _blobs_of(json.dumps({"layers": [{"digest": "sha256:" + "ab" * 32, "size": 10}]}).encode(),
                     parse_model_name("m:1")) == [("ab" * 32, 10)]


def test_a_manifest_is_written_over_the_names_other_spelling(tmp_path):
    # Ollama names are one whatever their case: pulling SmolLM2:135m over smollm2:135m
    # left two manifests, and a delete removed only one of them.
    from ctxengine.ollama.registry_pull import _write_manifest
    from ctxengine.ollama.store import manifests, parse_model_name

    first = _write_manifest(tmp_path, parse_model_name("smollm2:135m"), b"{}")
    again = _write_manifest(tmp_path, parse_model_name("SmolLM2:135M"), b'{"layers": []}')
    assert again == first and first.read_bytes() == b'{"layers": []}'
    assert [n.display for n, _ in manifests(tmp_path)] == ["smollm2:135m"]


@pytest.mark.parametrize("damage", ["truncated", "same size"])
def test_a_damaged_blob_in_the_store_is_fetched_again(registry, tmp_path, smollm2_path, damage):
    # It was taken as it was: "already here, nothing fetched" for wrong bytes, and for a
    # truncated one an error whose advice (run the pull again) gave the same error again.
    from hub_servers import sha256_of
    assert pull("ollama://smollm2:135m", home=tmp_path, env=env_for(registry)).returncode == 0
    blob = tmp_path / "ollama/blobs" / f"sha256-{sha256_of(smollm2_path)}"
    size = blob.stat().st_size
    if damage == "truncated":
        os.truncate(blob, size // 2)
    else:
        with open(blob, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\x00" * 64)
    before = registry.sent
    r = pull("ollama://smollm2:135m", home=tmp_path, env=env_for(registry))
    assert r.returncode == 0, r.stderr
    assert "damaged" in r.stderr and registry.sent - before == size
    assert blob.read_bytes() == smollm2_path.read_bytes()


def test_a_manifest_misstating_a_stored_blobs_size_leaves_the_blob(registry, tmp_path, smollm2_path):
    # The blob was deleted as damaged (its size was checked before its sha256), and the
    # model sharing it lost its weights; the pull then failed all the same.
    assert pull("ollama://smollm2:135m", home=tmp_path, env=env_for(registry)).returncode == 0
    digest = sha256_of(smollm2_path)
    manifest = json.loads(next(registry.root.glob("manifests/*/library/smollm2/135m")).read_bytes())
    for layer in manifest["layers"]:
        layer["size"] += layer["digest"] == f"sha256:{digest}"  # one byte more, the same digest
    root = tmp_path / "lying"
    (root / "manifests/lying/evil/x").mkdir(parents=True)
    (root / "manifests/lying/evil/x/1").write_text(json.dumps(manifest))
    (root / "blobs").symlink_to(registry.root / "blobs")
    lying = FakeRegistry(root)
    try:
        r = pull(f"ollama://{lying.url.removeprefix('http://')}/evil/x:1", home=tmp_path, env={})
    finally:
        lying.close()
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "the manifest's size is wrong; the blob is kept" in r.stderr
    assert (tmp_path / "ollama/blobs" / f"sha256-{digest}").read_bytes() == smollm2_path.read_bytes()
    assert find_ollama_model("smollm2:135m", [tmp_path / "ollama"]).servable


@pytest.mark.parametrize("raw, says", [
    (b"[" * 100_000 + b"]" * 100_000, "is not an image manifest"),
    (json.dumps({"layers": [{"digest": "sha256:" + "ab" * 32, "size": 10},
                            {"digest": "sha256:" + "ab" * 32, "size": 11}]}).encode(), "twice, as 10 and 11 bytes"),
], ids=["nested past the recursion limit", "one digest, two sizes"])
def test_a_manifest_that_cannot_be_right_is_refused(raw, says):
    # The first was a RecursionError's traceback; the second kept both sizes, so that
    # one of them had to fail against the blob the other had fetched.
    from ctxengine.errors import CtxError
    from ctxengine.ollama.registry_pull import _blobs_of
    from ctxengine.ollama.store import parse_model_name

    with pytest.raises(CtxError, match=says):
        _blobs_of(raw, parse_model_name("m:1"))
    twice = {"layers": [{"digest": "sha256:" + "ab" * 32, "size": 10}] * 2}
    assert _blobs_of(json.dumps(twice).encode(), parse_model_name("m:1")) == [("ab" * 32, 10)]


class _BlobsGoRound(RegistryHandler):
    """The loopback registry, but each blob redirects to itself."""

    def do_GET(self) -> None:
        if "/blobs/" in self.path:
            return self.reply(307, b"", {"Location": self.path})
        super().do_GET()


def test_a_redirect_loop_is_one_line_saying_so(registry, tmp_path):
    # urllib's reason for it spans three lines ("... would lead to an infinite loop.\nThe last 30x ...").
    looping = FakeRegistry(registry.root)
    looping.RequestHandlerClass = _BlobsGoRound
    try:
        r = pull("ollama://smollm2:135m", home=tmp_path, env=env_for(looping))
    finally:
        looping.close()
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "answered HTTP 307 Temporary Redirect (a redirect loop) for the blob of smollm2:135m" in r.stderr
