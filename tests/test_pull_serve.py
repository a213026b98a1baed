"""Pulled models, served by name: `ctx serve` answers the ollama and openai
clients with a model pulled from the (loopback) Hub and one pulled from the
(loopback) Ollama registry, and `ctx run -hf` pulls and runs one."""
import json

import ollama
import openai
import pytest

from ollama_layout import make_ollama_store
from pull_fixtures import GEMMA_REPO, SMOL_REPO, make_hub, make_registry, pull, server_set
from servers import CtxServer, ctx, ctx_imports

GEMMA = f"hf.co/{GEMMA_REPO}:Q4_K_M"


@pytest.fixture(scope="module")
def servers(smollm2_path, gemma3_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("upstream")
    (folder / "README.md").write_text("# models\n")
    hub = make_hub(smollm2_path, gemma3_path, [], folder / "README.md")
    registry = make_registry(folder / "registry", smollm2_path, gemma3_path)
    yield hub, registry
    hub.close()
    registry.close()


@pytest.fixture(scope="module")
def served(servers, tmp_path_factory):
    hub, registry = servers
    root = tmp_path_factory.mktemp("serve")
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hf"), "HF_TOKEN": "", "CTX_OLLAMA_REGISTRY": registry.url}
    for spec in (f"hf://{GEMMA}".replace("hf://hf.co/", "hf://"), "ollama://smollm2:135m"):
        r = pull(spec, home=root / "home", env=env)
        assert r.returncode == 0, r.stderr
    listed = ctx("models", "list", home=root / "home", env=env).stdout
    assert GEMMA in listed and "smollm2:135m" in listed
    server = CtxServer(root, "--ollama-models", str(root / "home" / "ollama"), "-t", "1", http=True, env=env)
    yield server
    server.stop()


def test_ollama_client_by_pulled_names(served):
    with ollama.Client(host=served.url) as c:
        names = {m.model for m in c.list().models}
        assert {"smollm2:135m", GEMMA} <= names
        for name in ("smollm2:135m", GEMMA):
            r = c.chat(model=name, messages=[{"role": "user", "content": "Say hi."}],
                       options={"num_predict": 8, "temperature": 0})
            assert r.model == name and r.message.content.strip() and r.eval_count > 0


def test_openai_client_by_pulled_names(served):
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0) as c:
        assert {"smollm2:135m", GEMMA} <= {m.id for m in c.models.list()}
        for name in (GEMMA, "smollm2:135m"):
            r = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=8, temperature=0)
            assert r.model == name and r.choices[0].message.content.strip() and r.usage.completion_tokens > 0


def test_run_dash_hf_pulls_then_runs(servers, tmp_path):
    hub, _ = servers
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}
    # as `ctx pull` does, a one-shot command keeps trio (httpcore2 imports it where installed) out
    r, imported = ctx_imports("run", "-hf", f"{SMOL_REPO}:Q4_1", "-n", "4", "--raw", "The capital of France is",
                              watched=("trio",), home=tmp_path, env=env)
    assert r.returncode == 0 and imported == [], r.stderr
    assert r.stdout.strip()
    assert list((tmp_path / "hf" / "hub").glob("models--*/snapshots/*/SmolLM2-135M-Instruct-Q4_1.gguf"))


def test_a_name_the_hf_cache_holds_is_served_though_no_pull_listed_it(served):
    # Pulled as hf://ORG/REPO:Q4_K_M; asked for as hf.co/ORG/REPO (no quant: Q4_K_M), which
    # `ctx run -m` finds in the cache: the server finds it there too.
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0) as c:
        r = c.chat.completions.create(model=f"hf.co/{GEMMA_REPO}", messages=[{"role": "user", "content": "Hi."}],
                                      max_tokens=4, temperature=0)
        assert r.choices[0].message.content.strip() and r.usage.completion_tokens > 0
        with pytest.raises(openai.NotFoundError, match="not found"):
            c.chat.completions.create(model=f"hf.co/{GEMMA_REPO}:Q8_0", messages=[{"role": "user", "content": "Hi."}],
                                      max_tokens=4)


def test_a_server_serves_what_is_pulled_and_removed_while_it_runs(servers, smollm2_path, tmp_path):
    # No store at the start: `ctx pull` (another process) and the ollama client's pull
    # (through the server) both add a model the next request finds, with no restart.
    _, registry = servers
    other = tmp_path / "ollama-store"  # OLLAMA_MODELS: read, never written by the server
    env = {"CTX_OLLAMA_REGISTRY": registry.url, "OLLAMA_MODELS": str(other)}
    server = CtxServer(tmp_path, "-t", "1", http=True, env=env)
    try:
        with ollama.Client(host=server.url) as c:
            assert "gemma3:270m" not in {m.model for m in c.list().models}
            with pytest.raises(ollama.ResponseError) as err:
                c.generate(model="gemma3:270m", prompt="Hi", options={"num_predict": 2})
            assert err.value.status_code == 404

            assert pull("ollama://gemma3:270m", home=tmp_path / "home", env=env).returncode == 0
            r = c.chat(model="gemma3:270m", messages=[{"role": "user", "content": "Hi"}],
                       options={"num_predict": 4, "temperature": 0})
            assert r.model == "gemma3:270m" and r.eval_count > 0

            lines = list(c.pull("smollm2:135m", stream=True))
            assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
            blobs = [p for p in lines if p.digest]
            assert blobs and all(p.status == f"pulling {p.digest[7:19]}" for p in blobs)
            last = {p.digest: p for p in blobs}  # each blob's last line: all of it in
            assert all(p.completed == p.total for p in last.values())
            assert max(p.total for p in last.values()) > 50 << 20
            assert {"gemma3:270m", "smollm2:135m"} <= {m.model for m in c.list().models}
            assert c.pull("smollm2:135m", stream=False).status == "success"  # all there: nothing fetched
            with pytest.raises(ollama.ResponseError, match="not found|not pulled"):
                list(c.pull("library/nothing:1", stream=True))

            own = tmp_path / "home"
            gemma_blobs = {b.name for b in own.rglob("blobs/sha256-*")} - {f"sha256-{p.digest[7:]}" for p in blobs}
            assert gemma_blobs
            c.delete("gemma3:270m")
            assert not any(b.name in gemma_blobs for b in own.rglob("blobs/sha256-*"))
            assert list(own.rglob("manifests/*/library/smollm2/135m"))  # the other model's are kept
            assert "gemma3:270m" not in {m.model for m in c.list().models}
            with pytest.raises(ollama.ResponseError) as err:
                c.chat(model="gemma3:270m", messages=[{"role": "user", "content": "Hi"}])
            assert err.value.status_code == 404

            make_ollama_store(other, "elsewhere:1", smollm2_path)  # Ollama's own store, say
            assert "elsewhere:1" in {m.model for m in c.list().models}
            with pytest.raises(ollama.ResponseError, match="not in .*it is not deleted") as err:
                c.delete("elsewhere:1")
            assert err.value.status_code == 400 and (other / "manifests").is_dir()
    finally:
        server.stop()


def test_a_client_that_leaves_mid_pull_stops_it_and_the_next_pull_resumes(servers, tmp_path):
    import time

    import httpx

    _, registry = servers
    env = {"CTX_OLLAMA_REGISTRY": registry.url}
    (tmp_path / "store").mkdir()
    server = CtxServer(tmp_path, "-t", "1", "--ollama-models", str(tmp_path / "store"), http=True, env=env)
    try:
        with server_set(registry, rate=20e6):
            with httpx.stream("POST", f"{server.url}/api/pull", json={"model": "smollm2:135m"}, timeout=60) as r:
                for line in r.iter_lines():
                    if json.loads(line).get("completed", 0) > 8 << 20:
                        break  # and the connection closes
            sizes = []
            for _ in range(40):
                partials = list((tmp_path / "store" / "blobs").glob("*-partial"))
                sizes.append(partials[0].stat().st_size if partials else None)
                if len(sizes) > 3 and sizes[-1] == sizes[-4]:
                    break
                time.sleep(0.25)
        assert sizes[-1] is not None and 8 << 20 < sizes[-1] < 90 << 20  # stopped well before the end
        assert not list((tmp_path / "store").rglob("manifests/*/library/smollm2/135m"))
        before = registry.sent
        with ollama.Client(host=server.url) as c:
            assert c.pull("smollm2:135m", stream=False).status == "success"
            assert registry.sent - before < (98 << 20) - sizes[-1] + (1 << 20)  # only the rest was fetched
            assert c.generate(model="smollm2:135m", prompt="Hi", options={"num_predict": 2}).eval_count > 0
    finally:
        server.stop()


def test_server_pulls_join_replace_prune_and_stop_cleanly(servers, gemma3_path, tmp_path):
    import threading
    import time

    import httpx

    from hub_servers import FakeRegistry
    from ollama_layout import manifest_path

    registry_root = tmp_path / "registry"
    make_ollama_store(registry_root, "m:1", gemma3_path)
    registry = FakeRegistry(registry_root)
    (tmp_path / "store").mkdir()
    env = {"CTX_OLLAMA_REGISTRY": registry.url}
    server = CtxServer(tmp_path, "-t", "1", "--ollama-models", str(tmp_path / "store"), http=True, env=env)
    blobs = tmp_path / "store" / "blobs"
    try:
        with ollama.Client(host=server.url) as c:
            # Two clients, one pull: the second joins the first's (before, "another pull is downloading").
            with server_set(registry, rate=100e6):
                first = threading.Thread(target=lambda: got.append(c.pull("m:1", stream=False).status))
                got: list = []
                first.start()
                time.sleep(0.5)
                assert c.pull("M:1", stream=False).status == "success"
                first.join()
            assert got == ["success"] and registry.sent < 1.2 * sum(b.stat().st_size for b in blobs.iterdir())
            assert c.generate(model="m:1", prompt="Hi", options={"num_predict": 2}).eval_count > 0
            old = {b.name for b in blobs.iterdir()}

            # Pulled again, in another spelling, with other layers: one manifest, the old blobs gone.
            make_ollama_store(registry_root, "m:1", gemma3_path, system="Be brief.")
            assert c.pull("registry.ollama.ai/library/m:1", stream=False).status == "success"
            assert [p.name for p in (tmp_path / "store").rglob("manifests/*/*/*/*")] == ["1"]
            new = {b.name for b in blobs.iterdir()}
            assert new != old and old & new  # the weights are kept, the config blob replaced
            assert "Be brief." in c.show("m:1").modelfile  # served at once, not a second later

            c.delete("m:1")
            assert not list(blobs.iterdir()) and not manifest_path(tmp_path / "store", "m:1").exists()
            with pytest.raises(ollama.ResponseError) as err:
                c.generate(model="m:1", prompt="Hi")
            assert err.value.status_code == 404

        # Stopped mid-pull: the client is told at once; the server exits cleanly, at once.
        with server_set(registry, rate=5e6):
            with httpx.stream("POST", f"{server.url}/api/pull", json={"model": "m:1"}, timeout=60) as r:
                lines = r.iter_lines()
                assert json.loads(next(lines))["status"] == "pulling manifest"
                t = time.monotonic()
                server.proc.terminate()
                last = json.loads(list(lines)[-1])
        assert "server is stopping" in last["error"] and time.monotonic() - t < 5
    finally:
        server.stop()
        registry.close()


def test_a_registry_out_of_reach_is_a_503_not_a_404(tmp_path):
    from servers import free_port

    (tmp_path / "store").mkdir()
    env = {"CTX_OLLAMA_REGISTRY": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    server = CtxServer(tmp_path, "-t", "1", "--ollama-models", str(tmp_path / "store"), http=True, env=env)
    try:
        with ollama.Client(host=server.url) as c:
            with pytest.raises(ollama.ResponseError, match="cannot reach the registry") as err:
                c.pull("smollm2:135m", stream=False)
            assert err.value.status_code == 503  # the name may be right: not "not found"
    finally:
        server.stop()
