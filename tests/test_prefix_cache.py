"""The prefix cache (ctxengine.serving.prefix_cache) on the real model: reuse,
bounds, and output identical to computing the prompt from scratch."""
import asyncio
import time

import numpy as np
import pytest

import ctxengine
from ctxengine.engine.catalog import ModelCatalog
from ctxengine.serving.generate import Sampling
from ctxengine.serving.generation import GenerationRequest, Generations
from ctxengine.serving.prefix_cache import PrefixCache, common_prefix
from ctxengine.serving.prompts import Prompt
from ctxengine.serving.runtime import Runtime


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ctxengine.load(smollm2_path)
    yield m
    m.close()


def ids(model, text: str) -> list[int]:
    return model.tokenize(text)


def reply(ctx, n: int = 8) -> str:
    return "".join(p.text for p in ctx.generate(n, temperature=0.0))


def fresh_reply(model, prompt: list[int], n: int = 8) -> str:
    ctx = model.context(None)
    try:
        ctx.append(prompt)
        return reply(ctx, n)
    finally:
        ctx.delete()


def test_common_prefix():
    a = np.array([1, 2, 3, 4])
    assert common_prefix(a, np.array([1, 2, 9])) == 2
    assert common_prefix(a, a) == 4
    assert common_prefix(a, np.array([], dtype=np.int64)) == 0
    assert common_prefix(a, np.array([7])) == 0


def test_second_request_reuses_the_first_and_replies_the_same(model):
    cache = PrefixCache(model)
    first = ids(model, "The capital of France is Paris. The capital of Italy is")
    ctx, n = cache.acquire(first)
    assert n == 0 and ctx.name.startswith("_prefix/")
    ctx.append(first[n:])
    r1 = reply(ctx)
    cache.release(ctx)
    second = ctx.tokens + ids(model, ". The capital of Spain is")
    ctx2, n2 = cache.acquire(second)
    assert n2 == len(ctx.tokens) - 1  # the last sampled token's KV was never computed
    assert ctx2.n_cached == n2 and ctx2.tokens == second[:n2]
    ctx2.append(second[n2:])
    assert reply(ctx2) == fresh_reply(model, second)
    cache.release(ctx2)
    assert r1 == fresh_reply(model, first)
    assert len(cache) == 1  # the first entry is a prefix of the second: superseded
    assert cache.stats.hits == 1 and cache.stats.cached_tokens == n2
    cache.clear()
    assert not [n for n in model.contexts.names() if n.startswith("_prefix/")]


def test_identical_prompt_reuses_all_but_the_last_token(model):
    cache = PrefixCache(model)
    prompt = ids(model, "One two three four five six")
    ctx, _ = cache.acquire(prompt)
    ctx.append(prompt)
    cache.release(ctx)
    ctx2, n = cache.acquire(prompt)
    assert n == len(prompt) - 1
    ctx2.append(prompt[n:])
    assert reply(ctx2) == fresh_reply(model, prompt)
    cache.release(ctx2, keep=False)
    assert ctx2.name not in model.contexts
    cache.clear()


def test_entries_are_bounded_least_recently_used_first(model):
    cache = PrefixCache(model, max_entries=2)
    names = []
    for text in ("Alpha beta gamma", "Delta epsilon zeta", "Eta theta iota"):
        ctx, _ = cache.acquire(ids(model, text))
        ctx.append(ids(model, text))
        cache.release(ctx)
        names.append(ctx.name)
    assert len(cache) == 2
    assert names[0] not in model.contexts and names[1] in model.contexts and names[2] in model.contexts
    cache.clear()


def test_a_full_pool_leaves_nothing_cached(model):
    cache = PrefixCache(model, max_pool_fraction=0.0)
    ctx, _ = cache.acquire(ids(model, "Some prompt"))
    ctx.append(ids(model, "Some prompt"))
    cache.release(ctx)
    assert len(cache) == 0 and ctx.name not in model.contexts


def test_runtime_keeps_cache_contexts_out_of_the_clients_view(smollm2_path):
    runtime = Runtime(ModelCatalog.build([str(smollm2_path)], packaged=False))
    try:
        name = runtime.catalog.entries()[0].name
        m = runtime.model(name)
        cache = runtime.prefix_cache(name)
        ctx, _ = cache.acquire(ids(m, "Hello there"))
        ctx.append(ids(m, "Hello there"))
        cache.release(ctx)
        assert ctx.name in m.contexts and runtime.contexts() == []
        assert runtime.unload(name)  # the cache does not pin a model
        off = Runtime(ModelCatalog.build([str(smollm2_path)], packaged=False), prefix_cache_entries=0)
        off.model(name)
        assert off.prefix_cache(name) is None
        off.close()
    finally:
        runtime.close()


def test_a_reply_arrives_only_once_its_context_is_cached(smollm2_path, monkeypatch):
    """A client sends its next turn the moment a reply arrives: the reply's context must
    already be in the cache then. (The generation thread once told the client first and
    cached after; on a busy machine the next turn missed and prefilled everything.)"""
    slow_release = PrefixCache.release

    def release(self, ctx, *, keep=True):
        time.sleep(0.3)  # a busy machine, between the reply and the cache
        slow_release(self, ctx, keep=keep)

    monkeypatch.setattr(PrefixCache, "release", release)
    runtime = Runtime(ModelCatalog.build([str(smollm2_path)], packaged=False))
    try:
        name = runtime.catalog.entries()[0].name
        request = GenerationRequest(name, Prompt(text="The capital of France is"), Sampling(max_tokens=4))

        async def reply():
            return await (await Generations(runtime).start(request)).collect()

        finished = asyncio.run(reply())
        cache = runtime.prefix_cache(name)
        assert len(cache) == 1
        ctx, n = cache.acquire(finished.tokens + ids(runtime.model(name), " And"))
        assert n == len(finished.tokens) - 1
        ctx.delete()
    finally:
        runtime.close()
