"""`ctx` when what is around it fails: standard input or output closed or failing, options a
generation refuses, a context with no room left, a port out of range. Each is one line on
stderr, and the store is left as it should be: unchanged by a refusal, holding what was
generated when the output failed. A tiny random-weight model (tests/tiny_models.py) stands in
where no real model's text is needed."""
import subprocess

import pytest

from servers import CTX, ctx_env
from tiny_models import TinyConfig, make_weights, write_gguf

N_CTX = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    cfg = TinyConfig(n_ctx=N_CTX)
    write_gguf(path, cfg, make_weights(cfg))
    return path


def stored_context(tmp_path, model_path, text: str):
    """A store holding the context 'c' with ``text`` appended (none: an empty context)."""
    import ctxengine
    from ctxengine.store import Store

    model = ctxengine.load(model_path, threads=1)
    try:
        ctx = model.context("c")
        if text:
            ctx.append(text)
        with Store(tmp_path / "store") as store:
            ctx.snapshot(store, ref="c")
    finally:
        model.close()
    return tmp_path / "store"


def history(store_dir) -> tuple[int, int]:
    """How often 'c' has moved, and its tokens now."""
    from ctxengine.store import Store

    with Store(store_dir) as store:
        return len(store.ref_log("c")), store.get_manifest(store.resolve("c")).n_tokens


def store_ref(store) -> str:
    from ctxengine.store import Store

    with Store(store) as s:
        return s.resolve("c")


def ctx(tmp_path, *args, shell: str = 'exec "$@"', **streams) -> subprocess.CompletedProcess:
    """`ctx ARGS` under ``shell``, which may close a stream first (``<&-``, ``>&-``)."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **streams}
    return subprocess.run(["sh", "-c", shell, "sh", *CTX, *map(str, args)], text=True, timeout=120,
                          env=ctx_env(tmp_path / "home", CTX_STORE=str(tmp_path / "store")), **streams)


def gen(tmp_path, tiny, *args, **kw) -> subprocess.CompletedProcess:
    return ctx(tmp_path, "gen", "c", "-m", tiny, "-t", "1", *args, **kw)


# -- standard input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args,what", [(["run", "-n", "2"], "the prompt"), (["tokenize"], "the text"),
                                       (["append", "c", "-"], "the text")])
def test_a_closed_stdin_is_one_line(tmp_path, args, what):
    r = ctx(tmp_path, *args, shell='exec "$@" <&-')
    assert r.returncode == 1 and not r.stdout
    assert r.stderr == f"ctx {args[0]}: error: standard input is closed: give {what} as an argument\n"


# -- standard output --------------------------------------------------------------------------------
def test_gen_keeps_what_it_generated_when_the_reader_goes(tmp_path, tiny):
    """`ctx gen c | head -c 3`: the pipe breaks mid-stream; the tokens made so far are stored,
    and the command ends quietly, as `ctx ls | head` does."""
    store = stored_context(tmp_path, tiny, "hello")
    moves, n = history(store)
    env = ctx_env(tmp_path / "home", CTX_STORE=str(store))
    with subprocess.Popen([*CTX, "gen", "c", "-m", tiny, "-t", "1", "-n", "16"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as proc:
        proc.stdout.close()  # gone before the first piece
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, err
    after = history(store)
    assert after[0] == moves + 1 and n < after[1] <= n + 16
    assert err == f"c: {after[1]} tokens, snapshot {store_ref(store)[:12]}\n"


def test_gen_keeps_what_it_generated_when_its_output_fails(tmp_path, tiny):
    """A full disk, an I/O error: here a file open only for reading, so that writes fail (EBADF)."""
    store = stored_context(tmp_path, tiny, "hello")
    moves, n = history(store)
    (tmp_path / "out").touch()
    with open(tmp_path / "out", "rb") as read_only:
        r = gen(tmp_path, tiny, "-n", "16", stdout=read_only)
    after = history(store)
    assert r.returncode == 1 and after[0] == moves + 1 and n < after[1] <= n + 16
    assert r.stderr.splitlines() == [f"c: {after[1]} tokens, snapshot {store_ref(store)[:12]}",
                                     "ctx gen: error: cannot write to standard output: Bad file descriptor"]


CLOSED_STDOUT = "error: standard output is closed: the text would go nowhere (>/dev/null discards it)\n"


def test_gen_with_stdout_closed_refuses_and_writes_nothing(tmp_path, tiny):
    store = stored_context(tmp_path, tiny, "hello")
    before = history(store)
    r = gen(tmp_path, tiny, "-n", "4", shell='exec "$@" >&-')
    assert r.returncode == 1 and history(store) == before
    assert r.stderr == "ctx gen: " + CLOSED_STDOUT


def test_run_with_stdout_closed_refuses_before_the_model_loads(tmp_path):
    r = ctx(tmp_path, "run", "-n", "2", "hi", shell='exec "$@" >&-')
    assert r.returncode == 1 and r.stderr == "ctx run: " + CLOSED_STDOUT


def test_a_verb_whose_output_fails_says_so_in_one_line(tmp_path, tiny):
    """`ctx ls --json >/dev/full`: the output is small, so it fails only when flushed at the end."""
    stored_context(tmp_path, tiny, "hello")
    (tmp_path / "out").touch()
    with open(tmp_path / "out", "rb") as read_only:
        r = ctx(tmp_path, "ls", "--json", stdout=read_only)
    assert r.returncode == 1
    assert r.stderr == "ctx ls: error: cannot write to standard output: Bad file descriptor\n"


# -- a generation refused writes nothing -----------------------------------------------------------------
@pytest.mark.parametrize("args,says", [
    (["--temperature", "-1"], "ctx gen: error: sampling option temperature must be >= 0, got -1.0"),
    (["--top-p", "2"], "ctx gen: error: sampling option top_p must be in [0, 1], got 2.0"),
    (["--seed", "-1"], "ctx gen: error: sampling option seed must be None or in [0, 2**64), got -1"),
    (["-n", "-5"], "ctx gen: error: argument -n/--max-tokens: must be 0 or more, not -5 (usage: ctx gen --help)"),
    (["--stop="], "ctx gen: error: stop strings must not be empty"),
])
def test_a_refused_gen_writes_nothing(tmp_path, tiny, args, says):
    store = stored_context(tmp_path, tiny, "hello")
    before = history(store)
    r = gen(tmp_path, tiny, *args)
    assert r.returncode in (1, 2) and r.stderr == says + "\n" and not r.stdout
    assert history(store) == before


def test_gen_on_an_empty_context_writes_nothing(tmp_path, tiny):
    store = stored_context(tmp_path, tiny, "")
    before = history(store)
    r = gen(tmp_path, tiny, "-n", "4")
    assert r.returncode == 1 and "append a prompt before generating" in r.stderr
    assert len(r.stderr.splitlines()) == 1 and history(store) == before


def test_gen_on_a_full_context_is_refused_and_writes_nothing(tmp_path, tiny):
    store = stored_context(tmp_path, tiny, "x" * N_CTX)
    before = history(store)
    assert before[1] == N_CTX
    r = gen(tmp_path, tiny, "-n", "4")
    assert r.returncode == 1 and not r.stdout and history(store) == before
    assert r.stderr == f"ctx gen: error: context 'c' would hold at least {N_CTX + 1} tokens; the model's " \
                       f"context length is {N_CTX}\n"


# -- ports ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("port", ["83888", "65536", "0"])
def test_push_refuses_a_port_out_of_range(tmp_path, port):
    """gRPC dials a port modulo 65536: 83888 would reach whatever listens on 18352."""
    r = ctx(tmp_path, "push", "c", f"127.0.0.1:{port}")
    assert r.returncode == 1
    assert r.stderr == f"ctx push: error: port {port} in '127.0.0.1:{port}' is out of range (1 to 65535)\n"


def test_parse_target_takes_ports_1_to_65535_only():
    from ctxengine.errors import CtxError
    from ctxengine.rpc.channel import parse_target

    assert parse_target("h:65535") == "h:65535" and parse_target("[::1]:1") == "[::1]:1"
    assert parse_target("h") == "h:11436"
    for bad in ("h:65536", "[::1]:70000", "h:0", "h:99999999999999999999"):
        with pytest.raises(CtxError, match="out of range"):
            parse_target(bad)
    with pytest.raises(CtxError, match="bad port"):
        parse_target("h:\u0663")  # a digit, but not an ASCII one


@pytest.mark.parametrize("mb", ["inf", "nan", "0", "33"])
def test_push_refuses_a_chunk_no_server_takes(tmp_path, mb):
    """--chunk-mb inf was an OverflowError's traceback; a chunk past the 64 MiB a server's
    call carries was refused by the server after the connection."""
    r = ctx(tmp_path, "push", "c", "127.0.0.1:1", "--chunk-mb", mb)
    assert r.returncode == 1
    assert r.stderr == f"ctx push: error: --chunk-mb must be more than 0 and at most 32 (a server takes at most " \
                       f"64 MiB a call), not {float(mb):g}\n"
