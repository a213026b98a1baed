"""The `ctx` command as a user runs it: a real process, real model."""
import json
import os
import subprocess
import sys

import pytest
from servers import ctx_imports


def ctx(*args, input=None, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "ctxengine.cli.main", *args], capture_output=True, text=True,
                          input=input, env=e, timeout=300)


def test_run_streams_a_chat_reply_with_the_default_model():
    r = ctx("run", "What is the capital of France? Answer in one word.", "-n", "12")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_run_reads_its_prompt_from_stdin_and_refuses_none():
    r = ctx("run", "-n", "12", input="What is the capital of France? Answer in one word.\n")
    assert r.returncode == 0 and "Paris" in r.stdout, r.stderr
    r = ctx("run", "-n", "4", input=" \n")
    assert r.returncode == 1 and "no prompt" in r.stderr and not r.stdout


def test_run_raw_continues_text(smollm2_ref):
    case = smollm2_ref["greedy"][0]
    r = ctx("run", "--raw", case["prompt"], "-n", "8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(" Paris")


@pytest.mark.parametrize("kv", ["q8", "vq8"])
def test_run_with_a_quantized_kv(smollm2_ref, kv):
    case = smollm2_ref["greedy"][0]
    r = ctx("run", "--raw", "--kv", kv, case["prompt"], "-n", "8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(" Paris")


def test_tokenize_matches_reference(smollm2_ref):
    case = smollm2_ref["tokenize"][6]
    r = ctx("tokenize", case["text"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == case["ids"]


def test_bytes_that_are_not_utf8_are_read_as_llama_cpp_reads_them(smollm2_path):
    # Python kept them as lone surrogates, which the tokenizer wrote as 3 bytes each (ED B3 xx)
    import ctxengine as ce
    want = ce.load(smollm2_path).tokenize("abc\ufffd\ufffd def")  # llama.cpp: one U+FFFD a byte
    given = b"abc\xff\xfe def"
    piped = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "tokenize"], input=given,
                           capture_output=True, timeout=300)
    argv = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "tokenize", given], capture_output=True,
                          timeout=300)
    for r in (piped, argv):
        assert r.returncode == 0 and json.loads(r.stdout) == want, r.stderr


def test_models_verify_reports_the_weight_id(tmp_path):
    r = ctx("models", "verify", env={"CTX_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "weight_id" in r.stdout


def test_models_list_names_what_cannot_be_served_and_why(tmp_path):
    import gguf
    import numpy as np
    from tiny_models import TinyConfig, make_weights, write_gguf

    folder = tmp_path / "models"
    folder.mkdir()
    write_gguf(folder / "tiny.gguf", TinyConfig(), make_weights(TinyConfig()))
    w = gguf.GGUFWriter(str(folder / "mamba.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (folder / "cut.gguf").write_bytes((folder / "tiny.gguf").read_bytes()[:5000])
    r = ctx("models", "list", "--models-dir", str(folder), "--no-ollama", env={"CTX_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()}
    assert str(folder / "tiny.gguf") in lines["tiny"] and "cannot" not in lines["tiny"]
    assert "cannot be served: architecture 'mamba' is not supported" in lines["mamba"]
    assert "cannot be served:" in lines["cut"]
    assert "smollm2" in lines and "packaged" in lines["smollm2"]
    # gemma3's package is installed (a test dependency) but this CTX_HOME never built it: listed all the same
    assert not (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").exists()
    assert "packaged" in lines["gemma3"] and "built from its installed package on first use" in lines["gemma3"]


def test_models_list_imports_neither_the_runtime_nor_numpy(tmp_path):
    # The catalog's model sources were listed in state/model.py, which imports the runtime:
    # 0.2 s of a 0.32 s `ctx models list` (ctxengine/sources.py).
    r, imported = ctx_imports("models", "list", watched=("ctxengine.state.model", "gguf", "numpy"), home=tmp_path)
    assert r.returncode == 0 and "smollm2" in r.stdout, r.stderr
    assert imported == [], r.stderr


@pytest.mark.parametrize("args", [["run", "-m", "/nonexistent/model.gguf", "hi"], ["tokenize", "-m", "no-such-model", "x"]])
def test_errors_are_one_clear_line(args):
    r = ctx(*args)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bad_model_file_is_one_line(tmp_path, smollm2_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(smollm2_path.read_bytes()[: 5_000_000])
    r = ctx("run", "-m", str(bad), "hi")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
    # a model file whose metadata took more than the process's memory limit printed a traceback
    import ctxengine.cli.tokenize
    from ctxengine.cli.main import main

    def exhausted(args):
        raise MemoryError()
    monkeypatch.setattr(ctxengine.cli.tokenize, "main", exhausted)
    assert main(["tokenize", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ctx tokenize: error: out of memory") and len(err.strip().splitlines()) == 1, err


def test_a_thread_count_out_of_range_is_a_usage_error():
    for verb in ("run", "serve"):
        r = ctx(verb, "-t", "100000", *(["hi"] if verb == "run" else []))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert "-t/--threads: must be between 1 and 512 (0: one a core), not 100000" in r.stderr


def test_the_command_runs_blas_on_one_thread_unless_told_otherwise():
    """numpy's OpenBLAS threads spin after import; `ctx` (ctxengine.cli) asks for one, and a user's setting stands."""
    code = "import ctxengine.cli, numpy, os; print(os.environ['OPENBLAS_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for given, want in ((None, "1"), ("3", "3")):
        run_env = env if given is None else {**env, "OPENBLAS_NUM_THREADS": given}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want
