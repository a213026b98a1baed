"""A system message alone, on a template with no system turn (Gemma 3's folds it into
the first user turn), is refused by every face instead of vanishing into a context of
one BOS token; SmolLM2's template, which has one, renders it as before."""
import grpc
import pytest

import ctxengine as ce
from ctxengine.errors import RequestError
from ctxengine.rpc import Remote, RemoteError
from servers import CtxServer, ctx

SYSTEM = "You are terse."


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    model = ce.load(gemma3_path)
    yield model
    model.close()


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    model = ce.load(smollm2_path)
    yield model
    model.close()


def test_append_system_on_gemma_is_refused_and_leaves_the_context_empty(gemma):
    c = gemma.context("gs")
    with pytest.raises(RequestError, match="has no system turn") as info:
        c.append_system(SYSTEM)
    assert gemma.name in str(info.value) and "first user message" in str(info.value)
    assert info.value.param == "system" and c.n_tokens == 0
    c.delete()


def test_gemma_shows_a_system_message_given_with_the_first_user_message(gemma):
    c = gemma.context("gu")
    c.append_turns([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}])
    assert SYSTEM in gemma.detokenize(c.tokens)
    c.delete()


def test_smollm2_renders_a_system_message_alone_as_before(smollm2):
    c = smollm2.context("ss")
    c.append_system(SYSTEM)
    assert smollm2.detokenize(c.tokens) == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    c.delete()


def test_ctx_new_with_system_on_gemma_is_one_usage_line_and_stores_nothing(tmp_path, gemma3_path):
    store = tmp_path / "store"
    r = ctx("new", "gs", "-m", gemma3_path, "--system", SYSTEM, "--store", store, home=tmp_path / "home")
    assert r.returncode == 2 and not r.stdout, r.stderr
    line, = r.stderr.splitlines()
    assert line.startswith("ctx new: error: --system: Gemma 3 270m's chat template has no system turn"), line
    assert "ctx append gs --role user TEXT" in line
    r = ctx("new", "gs", "-m", gemma3_path, "--store", store, home=tmp_path / "home")
    assert r.returncode == 0, r.stderr  # the name was left free
    r = ctx("append", "gs", "-m", gemma3_path, "--role", "system", SYSTEM, "--store", store, home=tmp_path / "home")
    assert r.returncode == 2 and r.stderr.startswith("ctx append: error: --role system: "), r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_ctx_new_with_system_on_smollm2_still_renders_it(tmp_path):
    store = tmp_path / "store"
    r = ctx("new", "ss", "--system", SYSTEM, "--store", store, home=tmp_path / "home")
    assert r.returncode == 0 and r.stderr.startswith("ss: 10 tokens"), r.stderr


def test_grpc_create_with_system_on_gemma_is_invalid_argument(tmp_path, gemma3_path):
    server = CtxServer(tmp_path, "-m", str(gemma3_path))
    try:
        with Remote(server.target) as remote:
            with pytest.raises(RemoteError) as info:
                remote.create("gs", model="gemma-3-270m-q4_k_m", system=SYSTEM)
            assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "has no system turn" in info.value.details
            assert "gs" not in [c.name for c in remote.contexts()]  # nothing half-made is left
            assert remote.create("ss", model="smollm2", system=SYSTEM).n_tokens == 10
    finally:
        server.stop()
