"""What README.md and docs/ promise of the ctx command, held to: one-line errors that
name what is wrong (ctx bench's llama.cpp Python, ctx pull's usage, ctx models
verify, a store that is not there), a refusal that offers --force where the verb has
it, ctx gen leaving a JSON object open for the next one, and ctx serve saying at
start which models go without its --draft or a --lora adapter, and why."""
import json
import subprocess

import pytest

from api_server import running
from conftest import read_metadata
from lora_files import smollm2_lora
from servers import CTX, ctx, ctx_env, free_port
from tiny_models import write_tiny_models


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# -- ctx bench: the llama.cpp interpreter ---------------------------------------------------------
@pytest.mark.parametrize("how", ["option", "CTX_LLAMA_PYTHON", "CTX_LLAMACPP_PYTHON"])
def test_bench_with_a_llama_python_that_is_not_there_is_one_line_naming_it(tmp_path, how):
    python = "/nonexistent/python"
    env = {"CTX_LLAMA_PYTHON": "", "CTX_LLAMACPP_PYTHON": ""}  # neither of the machine's (CI sets one)
    args, env = (["--llama-python", python], env) if how == "option" else ([], {**env, how: python})
    r = ctx("bench", "--reps", "1", *args, home=tmp_path, env=env, timeout=600)
    where = "--llama-python" if how == "option" else f"${how}"
    assert r.returncode == 1 and not r.stdout
    assert one_line(r) == f"ctx bench: error: {where} {python}: no such file (it should name a Python that has " \
                          "llama-cpp-python)"


# -- usage and error lines -----------------------------------------------------------------------
def test_pull_without_arguments_says_what_to_name(tmp_path):
    r = ctx("pull", home=tmp_path)
    assert r.returncode == 2
    line = one_line(r)
    assert line.startswith("ctx pull: error: name what to pull: a model (hf://") and "REF | --" not in line
    assert "HOST[:PORT] REF for a snapshot" in line


def test_models_verify_errors_name_the_subcommand(tmp_path):
    r = ctx("models", "verify", "nosuch", home=tmp_path)
    assert r.returncode == 1
    assert one_line(r).startswith("ctx models verify: error: 'nosuch' is neither a known model name")


@pytest.mark.parametrize("verb", [["ls"], ["log", "x"], ["store", "stats"], ["export", "x", "out.snap"],
                                  ["rm", "x"], ["push", "x", "127.0.0.1:1"]])
def test_reading_verbs_do_not_make_a_store_where_there_is_none(tmp_path, verb):
    store = tmp_path / "no" / "store"
    r = ctx(*verb, "--store", store, home=tmp_path / "home")
    assert r.returncode == 1 and not r.stdout
    name = " ".join(verb[:2]) if verb[0] == "store" else verb[0]
    assert one_line(r).startswith(f"ctx {name}: error: no snapshot store at {store} ("), r.stderr
    assert not (tmp_path / "no").exists()


def test_an_existing_name_offers_force_only_where_the_verb_has_it(tmp_path):
    home, store = tmp_path / "home", tmp_path / "store"
    assert ctx("new", "a", "--store", store, home=home).returncode == 0
    assert ctx("export", "a", tmp_path / "a.snap", "--store", store, home=home).returncode == 0
    r = ctx("import", tmp_path / "a.snap", "--store", store, home=home)  # its name is "a" too
    assert r.returncode == 1
    assert one_line(r).endswith("'a' already exists in " + str(store) + " (--force moves it, or ctx rm a first)")
    assert ctx("import", tmp_path / "a.snap", "--force", "--store", store, home=home).returncode == 0
    for verb in (["new", "a"], ["fork", "a", "a"]):
        r = ctx(*verb, "--store", store, home=home)
        assert r.returncode == 1 and one_line(r).endswith("(ctx rm a first)") and "--force" not in r.stderr


# -- ctx gen: a JSON object left open ----------------------------------------------------------
def test_gen_no_close_json_leaves_the_object_for_the_next_gen(tmp_path):
    home, store = tmp_path / "home", tmp_path / "store"
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"}},
                                  "required": ["name"], "additionalProperties": False}))

    def gen(name, *args):
        r = ctx("gen", name, "--temperature", "0", *args, "--store", store, home=home)
        assert r.returncode == 0, r.stderr
        return r.stdout.rstrip("\n")

    for name in ("closed", "open"):
        assert ctx("new", name, "--store", store, home=home).returncode == 0
        r = ctx("append", name, "--role", "user", "Give a user as JSON.", "--store", store, home=home)
        assert r.returncode == 0, r.stderr
    assert json.loads(gen("closed", "-n", "8", "--json-schema", schema))  # closed within its 8 tokens
    first = gen("open", "-n", "8", "--json-schema", schema, "--no-close-json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(first)
    assert set(json.loads(first + gen("open", "-n", "64"))) == {"name"}


# -- ctx serve: a draft or an adapter that does not fit every model ------------------------------
@pytest.fixture(scope="module")
def fitted(tmp_path_factory, gemma3_path, smollm2_path):
    root = tmp_path_factory.mktemp("fits")
    tiny, = write_tiny_models(root, seeds=(1,))
    tuned = smollm2_lora(root / "tuned.gguf", read_metadata(smollm2_path))
    with running(root / "serve", "-m", str(gemma3_path), "-m", str(tiny), "--draft", str(gemma3_path),
                 "--lora", f"tuned={tuned}") as server:
        yield server


def test_serve_drafts_only_for_the_models_of_the_drafts_vocabulary(fitted, gemma3_path):
    warned = [line for line in fitted.log().splitlines() if "--draft" in line]
    assert len(warned) == 1, fitted.log()
    assert warned[0] == f"ctx serve: warning: --draft {gemma3_path} has another vocabulary than tiny-1, smollm2, " \
                        "which decode without it (it drafts for the served models that share its vocabulary)"
    ask = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    r = fitted.post("/v1/chat/completions", {"model": "smollm2", **ask})
    assert r.status_code == 200, r.text  # was a 400: "draft model ... has another vocabulary"
    r = fitted.post("/v1/chat/completions", {"model": "gemma-3-270m-q4_k_m", **ask})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_serve_tells_which_models_go_without_an_adapter_and_why(fitted):
    start = fitted.log()
    assert "ctx serve: warning: --lora tuned is not loaded with gemma-3-270m-q4_k_m (requests to it cannot use " \
           "it): tuned.gguf: an adapter for architecture 'llama', and this model is 'gemma3'" in start, start
    assert "with smollm2" not in start and "with tiny-1" not in start  # smollm2's; tiny-1's only its load tells
    r = fitted.post("/v1/completions", {"model": "tiny-1", "prompt": "ab", "max_tokens": 2})
    assert r.status_code == 200, r.text
    told = [line for line in fitted.log().splitlines() if "--lora tuned is not loaded with tiny-1" in line]
    assert len(told) == 1 and told[0].startswith("ctx serve: warning: ") and "tuned.gguf: " in told[0]
    assert fitted.get("/lora-adapters?model=smollm2").json()[0]["name"] == "tuned"


def test_serve_refuses_a_draft_that_fits_no_served_model(tmp_path, gemma3_path):
    tiny, = write_tiny_models(tmp_path, seeds=(1,))
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / gemma3_path.name).symlink_to(gemma3_path)  # the packaged gemma3, built: its vocabulary known
    cmd = [*CTX, "serve", "--draft", str(tiny), "--port", str(free_port()), "--grpc-port", "0", "--no-ollama",
           "--store", str(tmp_path / "store")]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=ctx_env(home), timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("ctx serve started with a draft that fits none of its models")
    assert r.returncode == 1
    assert one_line(r).startswith(f"ctx serve: error: --draft {tiny}: its vocabulary is not that of any served "
                                  "model (smollm2, gemma3)"), r.stderr

