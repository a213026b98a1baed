"""A fleet keys by the adapter set (docs/lora.md, docs/fleet.md): every host
advertises the LoRA adapters it runs with each weight id, and a context made
with adapters is restored only on a host that serves the same base weights
and the same adapters, where it continues bit-identically; a host without
them refuses it, naming the hosts that have them."""
from __future__ import annotations

import httpx
import pytest

import ctxengine as ce
from conftest import read_metadata
from ctxengine.engine.lora import file_id
from ctxengine.engine.weights import cached_weight_id
from lora_files import smollm2_lora
from redis_cluster import fleet, redis_cluster  # noqa: F401 (fixtures)
from servers import CtxServer

PROMPT = "The three primary colours are"
MORE = " Then"


@pytest.fixture
def adapter(tmp_path, smollm2_path):
    return smollm2_lora(tmp_path / "tuned.gguf", read_metadata(smollm2_path), strength=5.0)


@pytest.fixture
def hosts(fleet, tmp_path, adapter):
    """Host a serves SmolLM2 with the adapter (at scale 0 by default), host b without it."""
    started = []
    try:
        for name, extra in (("a", ("--lora", f"tuned={adapter}:0")), ("b", ())):
            started.append(CtxServer(tmp_path / name, "--fleet", fleet.url, "-t", "1", *extra, http=True,
                                     env={"CTX_HOST_ID": name}))
        yield started
    finally:
        for h in started:
            h.stop()


def test_a_context_with_adapters_goes_only_where_they_are_served(hosts, fleet, tmp_path, smollm2_path, adapter):
    a, b = hosts
    wid, aid = cached_weight_id(smollm2_path), file_id(adapter)
    model = ce.load(smollm2_path, threads=1, lora={"tuned": adapter})
    try:
        with ce.Store(tmp_path / "maker", fleet=fleet.url, host_id="maker") as store:
            # What each host advertises, and what the fleet answers from it.
            assert store.fleet.hosts_serving(wid) == ["a", "b"]
            assert store.fleet.hosts_serving(wid, [aid]) == ["a"]
            assert store.fleet.hosts_serving(wid, [aid, "0" * 64]) == []
            listed = {h["host"]: h for h in store.fleet.hosts()}
            assert listed["a"]["lora"] == {wid: [aid]} and listed["b"]["lora"] == {}

            # A context made elsewhere with the adapter, published as ref "conv".
            made = model.context("conv", lora={"tuned": 1.0})
            made.append(PROMPT)
            made.snapshot(store, ref="conv")
            made.append(MORE)
            expected = "".join(p.text for p in made.generate(8, temperature=0.0))

            # b serves the weights but not the adapter: refused, pointing at a.
            r = httpx.get(b.url + "/v1/contexts/conv", timeout=60)
            assert r.status_code == 400, r.text
            assert (f"made by weights {wid} ({model.engine.name}) with LoRA {aid[:12]} x 1.0, which this host "
                    f"does not serve; hosts serving them: a") in r.json()["error"]["message"]

            # a restores it with the adapter and continues it as the maker would have.
            r = httpx.post(a.url + "/v1/completions", timeout=120,
                           json={"model": "smollm2", "prompt": MORE, "max_tokens": 8, "temperature": 0,
                                 "context": "conv"})
            assert r.status_code == 200, r.text
            assert r.headers["x-ctx-host"] == "a"
            assert r.json()["choices"][0]["text"] == expected
            # Its turn, published, still records the adapter: b still refuses it.
            turn = store.fleet.get_manifest(store.fleet.get_ref("conv"))
            assert turn.arch["lora"] == [[aid, 1.0]] and turn.token_ids == made.tokens
            assert httpx.get(b.url + "/v1/contexts/conv", timeout=60).status_code == 400
    finally:
        model.close()
