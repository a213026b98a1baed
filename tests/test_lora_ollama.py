"""Ollama's ADAPTER layers, served in place: a model whose manifest carries a
LoRA adapter runs with it at scale 1 (as Ollama does), and one whose adapter
does not load is refused, never served as the bare base model."""
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.catalog import CatalogEntry, ModelCatalog
from ctxengine.errors import CtxError, ModelFileError, UnsupportedModelError
from ctxengine.ollama.store import add_ollama_models
from ctxengine.serving.runtime import Runtime
from lora_files import ALL, random_lora, write_lora
from ollama_layout import make_ollama_store
from test_lora import CFG, TOKENS, shapes
from tiny_models import make_weights, write_gguf

ADAPTER = "application/vnd.ollama.image.adapter"


@pytest.fixture
def served(tmp_path):
    write_gguf(tmp_path / "tiny.gguf", CFG, make_weights(CFG))
    write_lora(tmp_path / "lora.gguf", CFG.arch, random_lora(shapes(CFG), CFG.n_layer, 4, ALL, size=0.3))
    root = tmp_path / "ollama"
    make_ollama_store(root, "tuned", tmp_path / "tiny.gguf",
                      extra_layers=[(ADAPTER, (tmp_path / "lora.gguf").read_bytes())])
    make_ollama_store(root, "broken", tmp_path / "tiny.gguf", extra_layers=[(ADAPTER, b"not a gguf")])
    make_ollama_store(root, "twice", tmp_path / "tiny.gguf",
                      extra_layers=[(ADAPTER, (tmp_path / "lora.gguf").read_bytes())] * 2)
    make_ollama_store(root, "plain", tmp_path / "tiny.gguf")
    catalog = ModelCatalog([])
    add_ollama_models(catalog, [root])
    rt = Runtime(catalog, threads=1)
    yield rt, tmp_path
    rt.close()


def test_adapter_layer_applies_to_every_request(served):
    rt, tmp_path = served
    loras = rt.loras("tuned")
    assert [(a["name"], a["scale"]) for a in loras.describe()] == [("adapter", 1.0)]
    model = rt.model("tuned")
    ctx = model.context(None, lora=loras.for_request(None))
    ctx.append(TOKENS)
    ref = ce.load(tmp_path / "tiny.gguf", threads=1, lora={"x": tmp_path / "lora.gguf"})
    try:
        with_it, without = ref.context("a", lora={"x": 1.0}), ref.context("b")
        with_it.append(TOKENS)
        without.append(TOKENS)
        assert np.array_equal(ctx._sync(), with_it._sync())
        assert not np.array_equal(ctx._sync(), without._sync())
    finally:
        ref.close()


def test_an_adapter_that_does_not_load_refuses_the_model(served):
    rt, _ = served
    with pytest.raises(UnsupportedModelError, match="its ADAPTER layer cannot be used: sha256-[0-9a-f]{64}: "):
        rt.model("broken")
    assert rt.model("tuned") is not None  # the runtime goes on serving the others


def test_an_adapter_layer_listed_twice_refuses_the_model(served):
    rt, _ = served
    with pytest.raises(ModelFileError, match="lists this ADAPTER layer twice"):
        rt.model("twice")


def test_kv_made_without_the_fine_tune_never_comes_back_under_its_name(served, tmp_path):
    from ctxengine.store import Store
    rt, _ = served
    plain, tuned = rt.model("plain"), rt.model("tuned")
    assert plain.weight_id == tuned.weight_id
    with Store(tmp_path / "store") as store:
        for name, model, lora in (("p", plain, None), ("t", tuned, rt.loras("tuned").for_request(None))):
            ctx = model.context(name, lora=lora)
            ctx.append(TOKENS)
            ctx.snapshot(store, ref=name)
            ctx.delete()
        assert rt.served_name(plain.weight_id, []) == "plain:latest"
        tuned_ids = [a for a, _ in rt.loras("tuned").for_request(None).key]
        assert rt.served_name(plain.weight_id, tuned_ids) == "tuned:latest"
        assert rt.sessions._restore(store, store.resolve("p"), "p2").lora.uses == ()


def test_a_models_own_adapter_cannot_be_turned_off(served):
    rt, _ = served
    loras = rt.loras("tuned")
    own = loras.for_request(None)
    assert loras.for_request([]) == own  # a request that lists none still gets it
    assert loras.for_request([{"name": "adapter", "scale": 1}]) == own
    from ctxengine.errors import RequestError
    for scale in (0, 0.5):
        with pytest.raises(RequestError, match="the model's own ADAPTER layer: part of the model"):
            loras.for_request([{"name": "adapter", "scale": scale}])
        with pytest.raises(ValueError, match="own ADAPTER layer"):
            loras.set_scales([{"id": 0, "scale": scale}])
    assert loras.for_request(None) == own


def test_a_context_goes_on_under_another_name_only_with_the_same_adapters(served):
    # A named context may be continued under another served name for the same weights
    # (a snapshot restored under the first of two names), never under one whose adapters
    # differ: base KV continued as the fine-tune, or the fine-tune's as the base.
    import asyncio

    from ctxengine.errors import RequestError
    from ctxengine.serving.generate import Sampling
    from ctxengine.serving.generation import GenerationRequest, Generations
    from ctxengine.serving.prompts import Prompt

    rt, _ = served
    gens = Generations(rt)
    rt.model("plain").context("p").append(TOKENS)
    rt.model("tuned").context("t", lora=rt.loras("tuned").for_request(None)).append(TOKENS)
    plain_copy = rt.catalog.add(CatalogEntry("plain-copy", rt.resolve("plain").path, "file"))

    async def turn(model, context):
        gen = await gens.start(GenerationRequest(model, Prompt(text=" more"), Sampling(max_tokens=2), context=context))
        return await gen.collect()

    assert asyncio.run(turn(plain_copy.name, "p")).completion_tokens == 2  # the same weights, no adapters either
    for model, context in (("tuned", "p"), ("plain", "t"), (plain_copy.name, "t")):
        with pytest.raises(RequestError, match="belongs to model"):
            asyncio.run(turn(model, context))


def test_load_by_name_runs_the_adapter_layer_too(served, monkeypatch):
    # ce.load / ctx run -m of the fine-tuned name ran the bare base under it
    rt, tmp_path = served
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    tuned = ce.load("tuned", threads=1)
    ref = ce.load(tmp_path / "tiny.gguf", threads=1, lora={"x": tmp_path / "lora.gguf"})
    try:
        assert tuned.own_lora == {"adapter": 1.0}
        ctx, with_it, without = tuned.context("t"), ref.context("a", lora={"x": 1.0}), ref.context("b")
        for c in (ctx, with_it, without):
            c.append(TOKENS)
        assert np.array_equal(ctx._sync(), with_it._sync())
        assert not np.array_equal(ctx._sync(), without._sync())
        assert np.array_equal(tuned.logprobs(TOKENS).top_logprobs, ref.logprobs(TOKENS, lora={"x": 1.0}).top_logprobs)
        with pytest.raises(CtxError, match="'adapter' is the model's own ADAPTER layer"):
            tuned.context("off", lora={"adapter": 0.0})
    finally:
        tuned.close()
        ref.close()
    with pytest.raises(UnsupportedModelError, match="its ADAPTER layer cannot be used: sha256-[0-9a-f]{64}: "):
        ce.load("broken", threads=1)
