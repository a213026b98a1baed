"""ctx pull hf://...: through huggingface_hub against a loopback Hub serving
the real SmolLM2 and Gemma 3 (model_info, resolve/ with redirects, ETags,
X-Repo-Commit and ranges); quant tags, split models, a killed pull resumed,
offline use from the cache."""
import os

import pytest

from ctxengine.engine.gguf_file import open_gguf
from hub_servers import FakeHub, HubHandler
from pull_fixtures import GEMMA_REPO, SMOL_REPO, SPLIT_REPO, kill_halfway, make_hub, pull, server_set
from servers import ctx_imports
from gguf_splits import write_split


@pytest.fixture(scope="module")
def hub(smollm2_path, gemma3_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hub")
    parts = write_split(smollm2_path, folder, "SmolLM2-135M-Instruct-Q4_1", 3)
    (folder / "README.md").write_text("# SmolLM2 GGUF\n")
    server = make_hub(smollm2_path, gemma3_path, parts, folder / "README.md")
    yield server
    server.close()


def hub_env(hub, tmp_path, **extra) -> dict:
    # No xet: the loopback Hub sends no xet headers, so huggingface_hub would not use it anyway;
    # this only keeps a stray HF_TOKEN or cache of the machine out.
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "", "HF_HUB_DISABLE_XET": "1",
            **extra}


def test_quant_tag_picks_the_file_and_a_second_pull_moves_nothing(hub, tmp_path, smollm2_path):
    before = hub.sent
    r = pull(f"hf://{SMOL_REPO}:q4_k_m", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0, r.stderr
    path = tmp_path / r.stdout.strip()
    assert path.name == "SmolLM2-135M-Instruct-Q4_K_M.gguf" and "snapshots" in str(path)
    assert path.read_bytes() == smollm2_path.read_bytes()
    assert hub.sent - before == smollm2_path.stat().st_size
    again = hub.sent
    r = pull(f"hf://{SMOL_REPO}:Q4_K_M", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0 and "nothing fetched" in r.stderr and hub.sent == again


def test_a_pull_imports_neither_hf_api_nor_gguf_nor_numpy_nor_trio(hub, tmp_path):
    # They were 0.17 s, 0.05-0.07 s and 0.07-0.1 s of a pull's 0.6 s before its first byte: the
    # listing is read by hf_listing.py, the header's type tables are gguf_types.py's, and a
    # header-only read decodes its arrays with struct (docs/pull.md). trio (a test dependency's
    # here), which httpcore2 imports where installed, 0.1 s more: cli/pull.py keeps it out.
    watched = ("huggingface_hub.hf_api", "gguf", "numpy", "trio")
    r, imported = ctx_imports("pull", f"hf://{SMOL_REPO}:Q4_1", watched=watched, home=tmp_path,
                              env=hub_env(hub, tmp_path))
    assert r.returncode == 0 and imported == [], r.stderr


def test_ambiguous_or_absent_quant_lists_the_choices(hub, tmp_path):
    r = pull(f"hf://{SMOL_REPO}:Q4_K", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert "ambiguous" in r.stderr and "Q4_K_M.gguf" in r.stderr and "Q4_K_S.gguf" in r.stderr
    r = pull(f"hf://{SMOL_REPO}:Q2_K", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 1 and "Q4_1.gguf" in r.stderr and "README" not in r.stderr


def test_unknown_repo_says_token_or_name(hub, tmp_path):
    r = pull("hf://ctx-test/nope-GGUF:Q4_K_M", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 1 and "not found" in r.stderr and "HF_TOKEN" in r.stderr and "check the name" in r.stderr


def test_split_model_pulled_whole_and_loaded_as_one(hub, tmp_path, smollm2_path):
    r = pull(f"hf://{SPLIT_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0, r.stderr
    first = tmp_path / r.stdout.strip()
    assert first.name.endswith("-00001-of-00003.gguf")
    assert sorted(p.name for p in first.parent.iterdir()) == [f"SmolLM2-135M-Instruct-Q4_1-0000{i}-of-00003.gguf"
                                                              for i in (1, 2, 3)]
    with open_gguf(first) as split, open_gguf(smollm2_path) as whole:
        assert list(split.tensors) == list(whole.tensors) and len(split.parts) == 2
    (first.parent / "SmolLM2-135M-Instruct-Q4_1-00003-of-00003.gguf").unlink()  # gone from the cache
    from servers import ctx
    r = ctx("run", "-m", f"hf.co/{SPLIT_REPO}:Q4_1", "-n", "2", "Hi", home=tmp_path,
            env=hub_env(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert r.returncode == 1 and "-00001-of-00003.gguf lacks SmolLM2-135M-Instruct-Q4_1-00003-of-00003.gguf" in r.stderr


def test_killed_pull_resumes_with_a_range_request(hub, tmp_path, gemma3_path):
    hub.rate = 40e6
    try:
        kept = kill_halfway(f"hf://{GEMMA_REPO}:Q4_K_M", "hf/hub/models--*/blobs/*.incomplete", tmp_path,
                            home=tmp_path, env=hub_env(hub, tmp_path), at=30 << 20)
    finally:
        hub.rate = None
    size = gemma3_path.stat().st_size
    before = hub.sent
    r = pull(f"hf://{GEMMA_REPO}:Q4_K_M", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0, r.stderr
    assert hub.sent - before == size - kept
    assert "resumed from an earlier pull" in r.stderr
    assert (tmp_path / r.stdout.strip()).stat().st_size == size


def test_offline_uses_the_cache_or_says_what_is_missing(hub, tmp_path):
    assert pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path)).returncode == 0
    offline = hub_env(hub, tmp_path, HF_HUB_OFFLINE="1")
    r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=offline)
    assert r.returncode == 0 and "nothing fetched" in r.stderr
    r = pull(f"hf://{SMOL_REPO}:Q4_K_S", home=tmp_path, env=offline)
    assert r.returncode == 1 and "HF_HUB_OFFLINE" in r.stderr
    assert "not in the Hugging Face cache" in r.stderr and "SmolLM2-135M-Instruct-Q4_1.gguf" in r.stderr
    from servers import ctx, free_port
    unreachable = hub_env(hub, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=unreachable)
    assert r.returncode == 0 and "nothing fetched" in r.stderr
    r = pull(f"hf://{GEMMA_REPO}:Q4_K_M", home=tmp_path, env=unreachable)
    assert r.returncode == 1 and "cannot be reached" in r.stderr and "not in the Hugging Face cache" in r.stderr
    r = ctx("run", "-m", f"hf.co/{SMOL_REPO}:Q4_1", "-n", "4", "--raw", "Hello", home=tmp_path,
            env={**offline, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 0, r.stderr


def test_tampered_download_is_refused_and_deleted(hub, tmp_path, smollm2_path):
    from hub_servers import sha256_of
    digest = sha256_of(smollm2_path)
    hub.tamper.add(digest)
    try:
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path))
    finally:
        hub.tamper.discard(digest)
    error = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and error.startswith("ctx pull: error: ") and "partial download was deleted" in error
    assert not list((tmp_path / "hf").rglob("*.incomplete")) and not list((tmp_path / "hf").rglob("*.gguf"))


def test_body_broken_off_is_asked_again_from_where_it_stopped(hub, tmp_path, smollm2_path):
    size = smollm2_path.stat().st_size
    before = hub.sent
    with server_set(hub, break_at=size // 3):  # the connection closes a third of the way through, once
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0, r.stderr
    assert "broke off" in r.stderr and hub.sent - before == size  # broken off once, and no byte sent twice
    assert (tmp_path / r.stdout.strip()).read_bytes() == smollm2_path.read_bytes()


def test_server_ignoring_the_range_gets_the_file_started_over(hub, tmp_path, smollm2_path):
    from hub_servers import sha256_of
    blobs = tmp_path / "hf" / "hub" / f"models--{SMOL_REPO.replace('/', '--')}" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha256_of(smollm2_path)}.incomplete").write_bytes(b"\0" * 123_456)  # not the file's first bytes
    before = hub.sent
    with server_set(hub, ranges=False):
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0, r.stderr
    assert hub.sent - before == smollm2_path.stat().st_size and "resumed" not in r.stderr
    assert (tmp_path / r.stdout.strip()).read_bytes() == smollm2_path.read_bytes()


@pytest.mark.parametrize("etag", ["../../../../escaped", "/tmp/escaped-abs", "B" * 64])
def test_an_etag_that_is_no_hash_names_no_file(hub, tmp_path, etag):
    name = "SmolLM2-135M-Instruct-Q4_1.gguf"
    hub.etags[name] = etag
    try:
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path))
    finally:
        del hub.etags[name]
    assert r.returncode == 1 and "not a sha256 or git hash: refusing to name a file" in r.stderr
    assert not list(tmp_path.rglob("*escaped*")) and not list((tmp_path / "hf").rglob("*.gguf"))
    assert not list(tmp_path.parent.glob("escaped*")) and not (tmp_path.parent.parent / "escaped").exists()


def test_space_is_asked_only_for_the_bytes_still_missing(hub, tmp_path, smollm2_path):
    # The whole model was asked for, cached or half-fetched: a full disk refused a cached model,
    # and a resume after "disk full" needed room for the whole file again.
    from ctxengine.engine.hf_listing import Listing
    from ctxengine.engine.hf_pull import HubSettings, _still_needed
    from hub_servers import sha256_of
    assert pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path)).returncode == 0
    settings = HubSettings(hub.url, str(tmp_path / "hf" / "hub"), False)
    size, sha = smollm2_path.stat().st_size, sha256_of(smollm2_path)
    commit = hub.commit(SMOL_REPO)
    q41, q4ks = "SmolLM2-135M-Instruct-Q4_1.gguf", "SmolLM2-135M-Instruct-Q4_K_S.gguf"
    assert _still_needed(SMOL_REPO, [q41], Listing(commit, {q41: size}, {q41: sha}), settings) == 0
    assert _still_needed(SMOL_REPO, [q4ks], Listing(commit, {q4ks: size}, {q4ks: sha}), settings) == 0  # its blob is there
    blobs = next((tmp_path / "hf" / "hub").glob("models--*/blobs"))
    (blobs / ("ab" * 32 + ".incomplete")).write_bytes(b"x" * 1000)
    assert _still_needed(SMOL_REPO, [q4ks], Listing(commit, {q4ks: size}, {q4ks: "ab" * 32}), settings) == size - 1000


def test_a_name_without_quant_means_one_file_online_and_offline(hub, tmp_path):
    # Offline, with only Q4_1 cached, "the repo's only model" took Q4_1; online the name is Q4_K_M.
    assert pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path)).returncode == 0
    offline = hub_env(hub, tmp_path, HF_HUB_OFFLINE="1")
    r = pull(f"hf://{SMOL_REPO}", home=tmp_path, env=offline)
    assert r.returncode == 1 and "not in the Hugging Face cache" in r.stderr and "Q4_1.gguf" in r.stderr
    r = pull(f"hf://{SMOL_REPO}", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0 and r.stdout.strip().endswith("Q4_K_M.gguf"), r.stderr
    r = pull(f"hf://{SMOL_REPO}", home=tmp_path, env=offline)
    assert r.returncode == 0 and r.stdout.strip().endswith("Q4_K_M.gguf") and "(0.0 MiB)" not in r.stderr


def test_a_pulled_name_runs_as_org_repo_quant_and_a_failed_pull_is_not_listed(hub, tmp_path):
    from servers import ctx
    assert pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path)).returncode == 0
    offline = {**hub_env(hub, tmp_path, HF_HUB_OFFLINE="1"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = ctx("run", "-m", f"{SMOL_REPO}:Q4_1", "-n", "2", "--raw", "Hello", home=tmp_path, env=offline)
    assert r.returncode == 0, r.stderr  # docs/pull.md's promise; was "neither a known model name, ..."
    index = next(tmp_path.rglob("hf-models.json"))
    before = index.read_text()
    (tmp_path / "bad.gguf").write_text("not a GGUF file, under a GGUF name\n")
    bad = FakeHub({"ctx-test/bad-GGUF": {"bad-Q4_K_M.gguf": tmp_path / "bad.gguf"}})
    try:
        r = pull("hf://ctx-test/bad-GGUF", home=tmp_path, env=hub_env(bad, tmp_path))
    finally:
        bad.close()
    assert r.returncode == 1 and "cannot be served" in r.stderr
    assert index.read_text() == before  # the name a failed pull asked for is not recorded


def test_token_gate_and_missing_file_errors_say_what_is_wrong(hub, tmp_path):
    name = "SmolLM2-135M-Instruct-Q4_K_S.gguf"
    cases = [  # (what the Hub does, the token, what the one-line error must say)
        ("refuse_tokens", "hf_expired", "refused the token in HF_TOKEN"),  # was httpx's raw text
        ("gated", "hf_ok", "your token's account has no access to it yet"),  # was "set HF_TOKEN" with one set
        ("gated", "", "accept its terms on the Hub, then set HF_TOKEN"),
        ("hidden", "", f"{name} is in the repo's listing, but"),  # was "RemoteEntryNotFoundError: 404"
    ]
    for what, token, says in cases:
        hub.refuse_tokens = what == "refuse_tokens"
        hub.gated = {SMOL_REPO} if what == "gated" else set()
        hub.hidden = {name} if what == "hidden" else set()
        try:
            r = pull(f"hf://{SMOL_REPO}:Q4_K_S", home=tmp_path, env=hub_env(hub, tmp_path, HF_TOKEN=token))
        finally:
            hub.refuse_tokens, hub.gated, hub.hidden = False, set(), set()
        assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (what, r.stderr)


def test_a_split_model_missing_a_part_is_named(tmp_path, smollm2_path):
    # The incomplete set was left out silently: "has no GGUF model files", naming nothing.
    parts = write_split(smollm2_path, tmp_path, "S-Q4_K_M", 3)
    hub = FakeHub({"ctx-test/split-missing": {p.name: p for p in (parts[0], parts[2])}})
    try:
        r = pull("hf://ctx-test/split-missing:Q4_K_M", home=tmp_path, env=hub_env(hub, tmp_path))
    finally:
        hub.close()
    assert r.returncode == 1 and "S-Q4_K_M-00001-of-00003.gguf lacks S-Q4_K_M-00002-of-00003.gguf" in r.stderr


def test_ctrl_c_says_the_pull_resumes_and_one_spelling_is_kept(hub, tmp_path):
    import json
    import signal
    import subprocess
    import time
    from pull_fixtures import CTX, ctx_env
    hub.rate = 40e6
    try:
        # SIGINT as a terminal's Ctrl-C gives it: a suite run in the background (`pytest &`) ignores
        # SIGINT, the child inherits that, and Python then raises no KeyboardInterrupt
        proc = subprocess.Popen([*CTX, "pull", f"hf://{GEMMA_REPO}:Q4_K_M"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=ctx_env(tmp_path, **hub_env(hub, tmp_path)),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob("hf/hub/models--*/blobs/*.incomplete")):
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        hub.rate = None
    assert proc.returncode == 130 and "interrupted; the bytes fetched are kept" in err, err  # was silent
    for tag in ("q4_1", "Q4_1", "Q4_1"):
        assert pull(f"hf://{SMOL_REPO}:{tag}", home=tmp_path, env=hub_env(hub, tmp_path)).returncode == 0
    names = json.loads(next(tmp_path.rglob("hf-models.json")).read_text())
    assert [n for n in names if n.lower().endswith(":q4_1")] == [f"hf.co/{SMOL_REPO}:Q4_1"]


def test_a_read_only_cache_is_named_before_the_space_it_lacks(tmp_path, monkeypatch):
    # A read-only cache on a small disk said "disk full": the space check ran first.
    from ctxengine.engine import disk
    from ctxengine.errors import CtxError
    monkeypatch.setattr(disk.os, "access", lambda path, mode: False)
    with pytest.raises(CtxError, match="permission denied: cannot write into"):
        disk.check_free_space(tmp_path, 1 << 60)


class _AnswersAsTold(HubHandler):
    """The loopback Hub, answering model_info with ``server.info_body`` when one is set,
    adding ``server.resolve_headers`` to resolve/'s redirect, and sending the CDN's
    requests round a redirect loop when ``server.loop_cdn``."""

    def do_GET(self) -> None:
        if self.server.loop_cdn and self.path.startswith("/cdn/"):
            return self.reply(302, b"", {"Location": self.path})
        super().do_GET()

    do_HEAD = do_GET

    def model_info(self, repo: str) -> None:
        if self.server.info_body is None:
            return super().model_info(repo)
        self.reply(200, self.server.info_body, {"Content-Type": "application/json"})

    def reply(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        if status == 302 and "/resolve/" in self.path:
            headers = {**(headers or {}), **self.server.resolve_headers}
        super().reply(status, body, headers)


@pytest.fixture(scope="module")
def told(smollm2_path):
    """A Hub serving SmolLM2's Q4_1 as the module's hub does (one repo, one commit, so one
    cache), whose answers a test may change."""
    server = FakeHub({SMOL_REPO: {"SmolLM2-135M-Instruct-Q4_1.gguf": smollm2_path}})
    server.RequestHandlerClass = _AnswersAsTold
    server.info_body, server.resolve_headers, server.loop_cdn = None, {}, False
    yield server
    server.close()


def _listing(told, size: int, **sibling) -> bytes:
    import json
    sha = told.sha["SmolLM2-135M-Instruct-Q4_1.gguf", SMOL_REPO]
    item = {"rfilename": "SmolLM2-135M-Instruct-Q4_1.gguf", "size": size,
            "lfs": {"sha256": sha, "size": size, "pointerSize": 134}, **sibling}
    return json.dumps({"id": SMOL_REPO, "sha": told.commit(SMOL_REPO), "siblings": [item]}).encode()


@pytest.mark.parametrize("answer, says", [
    ({"info_body": b"<html><body>Please log in to the proxy</body></html>"}, "(not JSON)"),
    ({"info_body": b"[]"}, "not a repo's listing: a JSON list"),
    ({"info_body": b"[" * 100_000 + b"]" * 100_000}, "JSON nested too deep"),
    ({"info_body": "lfs without sha256"}, "has the sha256 None"),
    ({"info_body": "rfilename 5"}, "a file's name is 5"),
    ({"info_body": "size -1"}, "is -1 bytes"),
    ({"resolve_headers": {"X-Repo-Commit": "../../../../escape"}}, "X-Repo-Commit '../../../../escape'"),
], ids=["html", "a list", "nested", "no sha256", "a number for a name", "a negative size", "commit ../"])
def test_a_hub_answer_not_understood_is_one_line_naming_it(told, tmp_path, smollm2_path, answer, says):
    # Each was a traceback (JSONDecodeError, TypeError, RecursionError, KeyError, AttributeError,
    # huggingface_hub's "Invalid pointer path"), or, for the negative size, taken.
    size = smollm2_path.stat().st_size
    body = answer.get("info_body")
    if body == "lfs without sha256":
        body = _listing(told, size, lfs={"size": size, "pointerSize": 134})
    elif body == "rfilename 5":
        body = _listing(told, size, rfilename=5)
    elif body == "size -1":
        body = _listing(told, -1)
    with server_set(told, info_body=body, resolve_headers=answer.get("resolve_headers", {})):
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(told, tmp_path))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"ctx pull: error: {told.url}: the Hub's answer to ") and says in r.stderr, r.stderr
    assert "could not be understood" in r.stderr and not list(tmp_path.rglob("*escape*"))


@pytest.mark.parametrize("size", ["-5", str(1 << 60)])
def test_a_size_no_file_has_is_refused_before_any_byte_moves(told, tmp_path, size):
    # -5 was taken: "sent 0 bytes of -5; they are kept in ....incomplete", a file that did
    # not exist, and the same on every try.
    before = told.sent
    with server_set(told, resolve_headers={"X-Linked-Size": size}):
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(told, tmp_path))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"could not be understood (X-Linked-Size {size} is no file's size)" in r.stderr and told.sent == before
    assert not list((tmp_path / "hf").rglob("*.incomplete"))


def test_a_truncated_file_in_the_cache_is_fetched_again(hub, told, tmp_path, smollm2_path):
    # It was "already here, nothing fetched", then "cannot be served", on every pull.
    from servers import ctx
    assert pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path)).returncode == 0
    blob = next((tmp_path / "hf" / "hub").glob("models--*/blobs/*"))
    size = blob.stat().st_size
    os.truncate(blob, size // 2)
    offline = {**hub_env(hub, tmp_path, HF_HUB_OFFLINE="1"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = ctx("run", "-m", f"hf.co/{SMOL_REPO}:Q4_1", "-n", "2", "Hi", home=tmp_path, env=offline)
    assert r.returncode == 1 and "truncated" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    before = hub.sent
    r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(hub, tmp_path))
    assert r.returncode == 0 and "fetched again" in r.stderr and hub.sent - before == size, r.stderr
    assert blob.read_bytes() == smollm2_path.read_bytes()
    # A Hub that misstates the size of a file the cache holds whole fails the pull; the blob stays.
    with server_set(told, info_body=_listing(told, size + 1), resolve_headers={"X-Linked-Size": size + 1}):
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(told, tmp_path))
    assert r.returncode == 1 and f"not the {size + 1} declared" in r.stderr, r.stderr
    assert blob.read_bytes() == smollm2_path.read_bytes()


def test_a_redirect_loop_is_one_line_saying_so(told, tmp_path):
    # urllib's reason for it spans three lines ("... would lead to an infinite loop.\nThe last 30x ...").
    with server_set(told, loop_cdn=True):
        r = pull(f"hf://{SMOL_REPO}:Q4_1", home=tmp_path, env=hub_env(told, tmp_path))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "answered HTTP 302 Found (a redirect loop) for SmolLM2-135M-Instruct-Q4_1.gguf" in r.stderr
