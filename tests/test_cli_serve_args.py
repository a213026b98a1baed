"""`ctx serve` refuses what it cannot serve before it starts, each time with one
line naming the argument and the cause; `ctx run` runs an Ollama model with its
SYSTEM, TEMPLATE and params layers, as `ctx serve` serves it."""
import socket
import subprocess
from pathlib import Path

import pytest

from ollama_layout import make_ollama_store
from servers import CTX, CtxServer, ctx_env, free_port

CHATML = (Path(__file__).parent / "data" / "ollama_templates" / "chatml.gotmpl").read_text()
SYSTEM = "You are a terse bot."


def serve(tmp_path, *args, timeout=60):
    """`ctx serve` that is expected to refuse its arguments: (returncode, stderr); a
    server that starts instead is stopped and fails the test."""
    cmd = [*CTX, "serve", "--store", str(tmp_path / "store"), "--no-ollama", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=ctx_env(tmp_path / "home"))
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"ctx serve {' '.join(map(str, args))} started instead of refusing:\n{err}")
    return proc.returncode, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- ports -------------------------------------------------------------------------------------
@pytest.mark.parametrize("option,value", [("--port", "99999"), ("--port", "-5"), ("--grpc-port", "83890"),
                                          ("--grpc-port", "65536"), ("--port", "abc")])
def test_a_port_out_of_range_is_a_usage_error(tmp_path, option, value):
    other = "--grpc-port" if option == "--port" else "--port"
    rc, err = serve(tmp_path, option, value, other, free_port(), timeout=30)
    assert rc == 2
    assert one_line(err).startswith(f"ctx serve: error: argument {option}: must be"), err
    if value != "abc":
        assert f"must be between 0 and 65535 (0: off), not {value}" in err


# -- limits ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("option,value,says", [
    ("--memory-budget", "nan", "must be a number of GiB >= 0, not nan"),
    ("--memory-budget", "inf", "must be a number of GiB >= 0, not inf"),
    ("--memory-budget", "1e400", "must be a number of GiB >= 0, not 1e400"),
    ("--memory-budget", "-1", "must be a number of GiB >= 0, not -1"),
    ("--repack-budget", "-0.5", "must be a number of GiB >= 0, not -0.5"),
    ("--repack-budget", "nan", "must be a number of GiB >= 0, not nan"),
    ("--prefix-cache", "-1", "must be 0 or more, not -1"),
    ("--max-body", "-5", "must be a number of bytes > 0, not -5"),
    ("--max-body", "0", "must be a number of bytes > 0, not 0"),
    ("--shutdown-timeout", "nan", "must be a number of seconds >= 0, got nan"),
    ("--shutdown-timeout", "-1", "must be a number of seconds >= 0, got -1"),
    ("--header-timeout", "inf", "must be a number of seconds > 0, got inf"),
])
def test_a_limit_out_of_range_is_a_usage_error(tmp_path, option, value, says):
    """Started with these, the server failed at start-up with a traceback (nan, inf), or failed
    every request later (a 500 for --prefix-cache -1, a 413 for --max-body -5)."""
    rc, err = serve(tmp_path, option, value, "--port", free_port(), "--grpc-port", "0", timeout=30)
    assert rc == 2
    assert one_line(err) == f"ctx serve: error: argument {option}: {says} (usage: ctx serve --help)"


def test_an_unknown_option_is_the_verbs_usage_error(tmp_path):
    rc, err = serve(tmp_path, "--bogus-flag", timeout=30)
    assert rc == 2
    assert one_line(err) == "ctx serve: error: unrecognized arguments: --bogus-flag (usage: ctx serve --help)"


# -- models, adapters, draft -------------------------------------------------------------------
@pytest.mark.parametrize("args,says", [
    (["-m", "/nonexistent/model.gguf"], "-m /nonexistent/model.gguf: '/nonexistent/model.gguf' is neither"),
    (["-m", "nosuchmodel"], "-m nosuchmodel: 'nosuchmodel' is neither"),
    (["--lora", "bad"], "--lora 'bad': cannot open bad: No such file or directory (expected NAME=PATH[:SCALE]"),
    (["--lora", "x=/nonexistent/a.gguf"], "--lora 'x=/nonexistent/a.gguf': cannot open /nonexistent/a.gguf"),
    (["--draft", "/nonexistent/draft.gguf"], "--draft /nonexistent/draft.gguf: '/nonexistent/draft.gguf' is neither"),
])
def test_a_model_adapter_or_draft_that_is_not_there_is_refused_at_start(tmp_path, args, says):
    rc, err = serve(tmp_path, *args, "--port", free_port(), "--grpc-port", "0")
    assert rc == 1
    assert one_line(err).startswith(f"ctx serve: error: {says}"), err


def test_a_model_file_that_cannot_be_served_is_refused_but_a_models_dir_lists_it(tmp_path, smollm2_path):
    folder = tmp_path / "models"
    folder.mkdir()
    cut = folder / "cut.gguf"
    cut.write_bytes(smollm2_path.read_bytes()[:5000])
    rc, err = serve(tmp_path, "-m", cut, "--port", free_port(), "--grpc-port", "0")
    assert rc == 1 and one_line(err).startswith(f"ctx serve: error: -m {cut}: "), err
    # The same file in --models-dir: listed, with why it cannot be served, as before.
    server = CtxServer(tmp_path / "dir", "--models-dir", str(folder), http=True)
    try:
        import httpx

        tags = {m["name"]: m for m in httpx.get(f"{server.url}/api/tags", timeout=30).json()["models"]}
        assert tags["cut"].get("error"), tags
    finally:
        server.stop()


# -- where it listens ----------------------------------------------------------------------------
@pytest.mark.parametrize("face", ["HTTP", "gRPC"])
def test_a_port_in_use_is_one_line_naming_it(tmp_path, face):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = ["--port", port, "--grpc-port", "0"] if face == "HTTP" else ["--port", "0", "--grpc-port", port]
        rc, err = serve(tmp_path, *ports)
    assert rc == 1
    assert one_line(err) == f"ctx serve: error: cannot listen for {face} on 127.0.0.1:{port}: port {port} is " \
                            "already in use", err


def test_a_host_that_does_not_resolve_says_so(tmp_path):
    rc, err = serve(tmp_path, "--host", "999.1.1.1", "--port", free_port(), "--grpc-port", "0")
    assert rc == 1
    line = one_line(err)
    assert line.startswith("ctx serve: error: --host 999.1.1.1: ") and "does not resolve" in line, err
    assert "in use" not in line


# -- ctx run with an Ollama model's layers ---------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    """An Ollama store: "terse" (SYSTEM and params layers over SmolLM2), "plain" (a copy of
    SmolLM2 without its Jinja template, with a ChatML TEMPLATE layer); and that copy's path."""
    root = tmp_path_factory.mktemp("ollama")
    data = smollm2_path.read_bytes()
    assert data.count(b"tokenizer.chat_template") == 1
    nojinja = root / "nojinja.gguf"
    nojinja.write_bytes(data.replace(b"tokenizer.chat_template", b"tokenizer.chat_templatX"))
    make_ollama_store(root, "terse:latest", smollm2_path, system=SYSTEM, params={"num_predict": 6})
    make_ollama_store(root, "plain:latest", nojinja, template=CHATML)
    return root, nojinja


def run(tmp_path, store_root, *args):
    r = subprocess.run([*CTX, "run", "--temperature", "0", *map(str, args)], capture_output=True, text=True,
                       env=ctx_env(tmp_path, OLLAMA_MODELS=str(store_root)), timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r


def test_run_applies_the_system_and_params_layers(tmp_path, store, smollm2_path):
    root, _ = store
    layered = run(tmp_path, root, "-m", "terse", "Say hi").stdout
    assert layered == run(tmp_path, root, "-m", smollm2_path, "--system", SYSTEM, "-n", "6", "Say hi").stdout
    assert layered != run(tmp_path, root, "-m", smollm2_path, "-n", "6", "Say hi").stdout
    # What the command line gives wins over the layers.
    longer = run(tmp_path, root, "-m", "terse", "-n", "10", "--system", "Answer in French.", "Say hi").stdout
    assert longer == run(tmp_path, root, "-m", smollm2_path, "-n", "10", "--system", "Answer in French.",
                         "Say hi").stdout


def test_run_renders_the_template_layer_of_a_model_without_its_own(tmp_path, store):
    import ctxengine
    from ctxengine.ollama.template import render_go_template

    root, nojinja = store
    model = ctxengine.load(nojinja)
    try:
        assert model.chat_template is None
        ctx = model.context()
        ctx.append(render_go_template(CHATML, messages=[{"role": "user", "content": "Say hi"}]), parse_special=True)
        want = "".join(p.text for p in ctx.generate(8, temperature=0.0))
    finally:
        model.close()
    r = run(tmp_path, root, "-m", "plain", "-n", "8", "Say hi")
    assert r.stdout == want + "\n" and not r.stderr, r.stderr
    assert run(tmp_path, root, "-m", nojinja, "-n", "8", "--raw", "Say hi").stdout != r.stdout


def test_run_says_once_when_a_model_has_no_template_at_all(tmp_path, store):
    root, nojinja = store
    r = run(tmp_path, root, "-m", nojinja, "-n", "4", "Say hi")
    assert one_line(r.stderr).startswith("ctx run: warning: ") and "has no chat template" in r.stderr
    assert r.stdout == run(tmp_path, root, "-m", nojinja, "-n", "4", "--raw", "Say hi").stdout
