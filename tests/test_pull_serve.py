"""Pulled models, served by name: `ctx serve` answers the ollama and openai
clients with a model pulled from the (loopback) Hub and one pulled from the
(loopback) Ollama registry, and `ctx run -hf` pulls and runs one."""
import ollama
import openai
import pytest

from pull_fixtures import GEMMA_REPO, SMOL_REPO, make_hub, make_registry, pull
from servers import CtxServer, ctx

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
    r = ctx("run", "-hf", f"{SMOL_REPO}:Q4_1", "-n", "4", "--raw", "The capital of France is", home=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
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
