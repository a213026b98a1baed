"""Arguments of the public Python API that a user can get wrong: each is refused with a
CtxError subclass naming the argument and what it may be (ctxengine/errors.py: anything
else escaping is a bug), and a refusal changes nothing."""
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.sampler import SamplerParams, apply_penalties
from ctxengine.errors import ContextError, RequestError

SEED = 20261203
FLOAT32_MAX = float(np.finfo(np.float32).max)
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


@pytest.fixture(scope="module")
def model():
    m = ce.load("smollm2", threads=2)
    yield m
    m.close()


@pytest.fixture
def ctx(model):
    c = model.context()
    c.append(PROMPT)
    yield c
    c.delete()


def greedy(ctx, n: int = 6, **options) -> list[int]:
    """The next n tokens after ctx's prompt (greedy unless options say otherwise), from a
    fork: ctx is left as it is."""
    branch = ctx.fork()
    try:
        pieces = branch.generate(n, **{"temperature": 0.0, **options})
        return [p.token_id for p in pieces if p.token_id is not None]
    finally:
        branch.delete()


# -- generate(stop=) ---------------------------------------------------------------------
def test_stop_none_means_no_stop_strings(ctx):
    assert greedy(ctx, stop=None) == greedy(ctx, stop=())


@pytest.mark.parametrize("stop", [5, ["ok", 1], [""], "fox", b"fox", [None]])
def test_a_stop_that_is_not_a_sequence_of_strings_is_refused_naming_it(ctx, stop):
    before = ctx.tokens
    with pytest.raises(RequestError, match="stop must be None or a sequence of non-empty strings") as err:
        next(ctx.generate(4, stop=stop, temperature=0.0))
    assert err.value.param == "stop" and ctx.tokens == before


# -- generate(speculative=) --------------------------------------------------------------
@pytest.mark.parametrize("speculative", ["yes", 1, object()])
def test_a_speculative_that_is_no_drafter_is_refused_naming_it(ctx, speculative):
    before = ctx.tokens
    with pytest.raises(RequestError, match=r"speculative must be None, True, False or a drafter "
                                           r"with propose\(tokens, k\)") as err:
        next(ctx.generate(4, speculative=speculative, temperature=0.0))
    assert err.value.param == "speculative" and ctx.tokens == before


def test_an_object_with_propose_drafts(ctx):
    class Repeat:  # drafts the last token again: often wrong, never in the output
        def propose(self, tokens, k):
            return [tokens[-1]] * k

    assert greedy(ctx, speculative=Repeat()) == greedy(ctx, speculative=False)


# -- fork(n_tokens=) ---------------------------------------------------------------------
@pytest.mark.parametrize("n_tokens", [1.5, True, False, -1, "2", 10**6])
def test_fork_checks_n_tokens_as_rewind_checks_n(ctx, n_tokens):
    with pytest.raises(ContextError, match=rf"n_tokens: an int in \[0, {ctx.n_tokens}\]"):
        ctx.fork(n_tokens=n_tokens)
    with pytest.raises(ContextError):
        ctx.rewind(n_tokens)


@pytest.mark.parametrize("n_tokens", [0, 3, np.int64(3)])
def test_fork_takes_any_int_up_to_the_length(ctx, n_tokens):
    branch = ctx.fork(n_tokens=n_tokens)
    assert branch.tokens == ctx.tokens[:int(n_tokens)]
    branch.delete()


# -- logprobs ----------------------------------------------------------------------------
def test_logprobs_of_more_tokens_than_the_context_length_names_both(model):
    n_ctx = model.config.n_ctx
    with pytest.raises(ContextError, match=f"logprobs of {n_ctx + 808} tokens: the model's context length "
                                           f"is {n_ctx}"):
        model.logprobs([1] * (n_ctx + 808))


@pytest.mark.parametrize("top", [0, -1, 1.5, True, "3"])
def test_logprobs_top_below_one_or_not_an_int_is_refused(model, top):
    with pytest.raises(RequestError, match=f"logprobs' top must be an int >= 1, not {top!r}") as err:
        model.logprobs([1, 2, 3], top=top)
    assert err.value.param == "top"


def test_logprobs_top_one_and_top_above_the_vocabulary(model):
    ids = model.tokenize(PROMPT)
    assert model.logprobs(ids, top=1).top_ids.shape == (len(ids), 1)
    assert model.logprobs(ids[:2], top=10**9).top_ids.shape == (2, model.config.n_vocab)


# -- load(threads=, n_ctx=) --------------------------------------------------------------
@pytest.mark.parametrize("threads", [-1, 513, 1.5, True, "2"])
def test_load_refuses_a_thread_count_naming_it(threads):
    with pytest.raises(RequestError, match="threads must be between 1 and 512") as err:
        ce.load("smollm2", threads=threads)
    assert err.value.param == "threads"


@pytest.mark.parametrize("n_ctx", [0, -5, 2.5, True])
def test_load_refuses_a_context_length_naming_it(n_ctx):
    with pytest.raises(RequestError, match=f"n_ctx must be a positive number of tokens, not {n_ctx!r}") as err:
        ce.load("smollm2", threads=2, n_ctx=n_ctx)
    assert err.value.param == "n_ctx"


def test_load_takes_a_context_length_above_the_trained_one_as_that_length(model):
    # as documented in load(): a draft model trained shorter than its target loads at its own length
    m = ce.load("smollm2", threads=2, n_ctx=10**9)
    try:
        assert m.config.n_ctx == model.config.n_ctx
    finally:
        m.close()
    m = ce.load("smollm2", threads=2, n_ctx=64)
    try:
        assert m.config.n_ctx == 64
    finally:
        m.close()


# -- a closed model ----------------------------------------------------------------------
def test_a_closed_model_refuses_every_use():
    m = ce.load("smollm2", threads=2)
    kept = m.context("kept")
    kept.append("Hello")
    m.close()
    with pytest.raises(ContextError, match="the model is closed"):
        m.context("new")
    with pytest.raises(ContextError, match="the model is closed"):
        m.logprobs([1, 2])
    with pytest.raises(ContextError, match="kept"):  # close() deleted it
        kept.append(" world")
    m.close()  # again: nothing to do


def test_a_context_whose_engine_closed_refuses_to_run():
    m = ce.load("smollm2", threads=2)
    c = m.context("c")
    c.append("Hello")
    before = c.tokens
    m.engine.close()  # as a server's unload does while a handle is still about
    with pytest.raises(ContextError, match="the model is closed"):
        c.append(" world")
    assert c.tokens == before
    m.close()


# -- very large penalties ----------------------------------------------------------------
@pytest.mark.parametrize("option", ["presence_penalty", "frequency_penalty"])
def test_a_penalty_beyond_float32_bans_as_a_large_one_does(ctx, option):
    assert greedy(ctx, **{option: 1e39}) == greedy(ctx, **{option: 1e30})
    sampled = [greedy(ctx, temperature=0.8, seed=SEED, **{option: value}) for value in (1e300, 1e30)]
    assert sampled[0] == sampled[1]


def test_a_negative_penalty_beyond_float32_all_but_forces_a_repeat(ctx):
    tokens = greedy(ctx, presence_penalty=-1e39)
    assert tokens == greedy(ctx, presence_penalty=-1e30)
    assert set(tokens) <= set(ctx.tokens)


def test_penalties_saturate_in_float32_and_never_lift_a_masked_token():
    x = np.array([1.0, -2.0, -np.inf, 3.0], dtype=np.float32)
    history = [0, 1, 1, 2]
    for params in (SamplerParams(presence_penalty=1e39, frequency_penalty=1e300),
                   SamplerParams(presence_penalty=-1e39, frequency_penalty=-1e300),
                   SamplerParams(repeat_penalty=1e-300), SamplerParams(repeat_penalty=1e300)):
        out = apply_penalties(x, history, params)
        assert out.dtype == np.float32 and not np.isnan(out).any()
        assert out[2] == -np.inf and out[3] == 3.0
        assert np.all(np.abs(out[:2]) <= FLOAT32_MAX)


def test_an_unknown_adapter_or_a_bad_scale_for_a_context_is_a_request_error(model):
    # Model.context(lora={"nope": 1}) raised the engine's plain ValueError.
    for lora, message in (({"nope": 1.0}, "unknown LoRA adapter 'nope'"), ([("x", 1)], "given as {name: scale}")):
        with pytest.raises(RequestError, match=message) as err:
            model.context(lora=lora)
        assert err.value.param == "lora"


# -- Context.shares_kv_at(n_tokens): reached the native core unchecked (pybind11's TypeError)
def test_shares_kv_at_takes_any_int_up_to_the_length(ctx):
    for n in (0, 3, np.int64(3), ctx.n_tokens):
        assert ctx.shares_kv_at(n) is True


@pytest.mark.parametrize("n_tokens", [1.5, True, False, -1, "2", None, 10**6, 10**30, np.float64(2.0)])
def test_shares_kv_at_refuses_what_is_no_count_of_its_tokens_naming_it(ctx, n_tokens):
    before = ctx.tokens
    with pytest.raises(RequestError, match=rf"n_tokens must be an int in \[0, {ctx.n_tokens}\], not ") as err:
        ctx.shares_kv_at(n_tokens)
    assert err.value.param == "n_tokens" and ctx.tokens == before


def test_shares_kv_at_refuses_a_context_of_another_model(ctx, tmp_path):
    from tiny_models import write_tiny_models
    other = ce.load(write_tiny_models(tmp_path, seeds=(1,))[0], threads=1)
    try:
        foreign = other.context()
        with pytest.raises(RequestError, match="n_tokens must be an int") as err:
            ctx.shares_kv_at(foreign)
        assert err.value.param == "n_tokens"
    finally:
        other.close()
