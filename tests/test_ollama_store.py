"""Ollama's model store: names as Ollama parses them, manifests and layers read in
place (never written), broken entries listed with a reason, ctxengine.load by name."""
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.catalog import ModelCatalog
from ctxengine.serving.catalog import build_catalog
from ctxengine.ollama.store import add_ollama_models, ollama_roots, parse_model_name
from ctxengine.state.model import resolve_model
from ctxengine.errors import CtxError, InvalidNameError, ModelNotFoundError, UnsupportedModelError
from lora_files import random_lora, write_lora
from ollama_layout import DEFAULT_HOST, blob_path, go_json, make_ollama_store, manifest_path
from tiny_models import TinyConfig, make_weights, write_gguf

TEMPLATE = "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
PARAMS = {"stop": ["<|im_end|>"], "temperature": 0.2, "num_ctx": 2048}
SYSTEM = "You are terse."
ADAPTER = "application/vnd.ollama.image.adapter"


def _mamba(path: Path, rows: int = 8) -> Path:
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((rows, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _other_arch_lora(files: Path) -> bytes:
    path = files / "gemma-adapter.gguf"
    write_lora(path, "gemma3", random_lora({"attn_q": (640, 1024)}, 1, 2, ("attn_q",)))
    return path.read_bytes()


def _iquant(path: Path) -> Path:
    cfg = TinyConfig(n_embd=256, n_head=4, head_dim=64, n_ff=256)
    write_gguf(path, cfg, make_weights(cfg), raw={"blk.0.ffn_up.weight": gguf.GGMLQuantizationType.IQ4_NL})
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    """One store: three good spellings of SmolLM2 and one of each kind of broken entry."""
    root = tmp_path_factory.mktemp("ollama") / "models"
    files = tmp_path_factory.mktemp("gguf")
    make_ollama_store(root, "smollm2:135m", smollm2_path, params=PARAMS, system=SYSTEM, template=TEMPLATE)
    make_ollama_store(root, "smollm2", smollm2_path)
    make_ollama_store(root, "someone/smol:q4", smollm2_path)
    make_ollama_store(root, "localhost:5000/team/smol:v1", smollm2_path)
    make_ollama_store(root, "mamba", _mamba(files / "mamba.gguf"))
    make_ollama_store(root, "iquant", _iquant(files / "iquant.gguf"))
    make_ollama_store(root, "safetensors", smollm2_path,
                      extra_layers=[("application/vnd.ollama.image.tensor", b"\0" * 64)])
    adapter = files / "adapter.gguf"
    write_lora(adapter, "llama", random_lora({"attn_q": (576, 576)}, 1, 2, ("attn_q",)))
    make_ollama_store(root, "adapter", smollm2_path, extra_layers=[(ADAPTER, adapter.read_bytes())])
    make_ollama_store(root, "notlora", smollm2_path, extra_layers=[(ADAPTER, b"lora")])
    make_ollama_store(root, "otherarch", smollm2_path, extra_layers=[(ADAPTER, _other_arch_lora(files))])
    make_ollama_store(root, "badparams", smollm2_path,
                      extra_layers=[("application/vnd.ollama.image.params", b"{not json")])
    make_ollama_store(root, "hotparams", smollm2_path, params={"temperature": "hot", "stop": ["x"]})
    make_ollama_store(root, "nostop", smollm2_path, params={"stop": [1]})
    make_ollama_store(root, "zeroctx", smollm2_path, params={"num_ctx": 0})
    make_ollama_store(root, "oddparams", smollm2_path, params={"unknown": [1, {}], "num_ctx": 64.0, "use_mmap": True})
    # A manifest whose model blob is gone.
    make_ollama_store(root, "gone", _mamba(files / "gone.gguf", rows=4))
    gone = json.loads(manifest_path(root, "gone").read_text())
    blob_path(root, gone["layers"][0]["digest"]).unlink()
    # Garbage where a manifest should be, and a file whose path is not a name.
    garbage = manifest_path(root, "garbage")
    garbage.parent.mkdir(parents=True)
    garbage.write_bytes(b"\x00\xffnot json")
    odd = root / "manifests" / DEFAULT_HOST / "library" / "-bad" / "latest"
    odd.parent.mkdir(parents=True)
    odd.write_bytes(go_json({"schemaVersion": 2, "layers": []}))
    return root


def _tree(root: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def catalog(store):
    before = _tree(store)
    cat = build_catalog(ollama=[store], packaged=False)
    assert _tree(store) == before  # read in place: nothing written, nothing touched
    return cat


# -- names ------------------------------------------------------------------------------
@pytest.mark.parametrize("name, parts, display", [
    ("smollm2:135m", (DEFAULT_HOST, "library", "smollm2", "135m"), "smollm2:135m"),
    ("smollm2", (DEFAULT_HOST, "library", "smollm2", "latest"), "smollm2:latest"),
    ("namespace/model", (DEFAULT_HOST, "namespace", "model", "latest"), "namespace/model:latest"),
    ("host:port/namespace/model:tag", ("host:port", "namespace", "model", "tag"), "host:port/namespace/model:tag"),
    ("scheme://host:port/namespace/model:tag", ("host:port", "namespace", "model", "tag"),
     "host:port/namespace/model:tag"),
    ("host/library/model:tag", ("host", "library", "model", "tag"), "host/library/model:tag"),
    ("registry.ollama.ai/library/dolphin-mistral:7b-v2.6-dpo-laser-q6_K",
     (DEFAULT_HOST, "library", "dolphin-mistral", "7b-v2.6-dpo-laser-q6_K"), "dolphin-mistral:7b-v2.6-dpo-laser-q6_K"),
    ("_why/_the/_lucky:_stiff", ("_why", "_the", "_lucky", "_stiff"), "_why/_the/_lucky:_stiff"),
])
def test_names_parse_and_display_as_ollamas(name, parts, display):
    n = parse_model_name(name)
    assert (n.host, n.namespace, n.model, n.tag) == parts
    assert n.display == display
    assert parse_model_name(n.full) == n == parse_model_name(name.upper())


@pytest.mark.parametrize("name", ["", "^", "mm:", "n/m:", "/nn/mm", "//", "hh//", "m@d", "-hh/nn/mm:tt",
                                  "hh/-nn/mm:tt", "hh/nn/mm:-tt", "host/name:space/model:tag", "../../etc:passwd",
                                  "a/b/c/d", "x" * 81])
def test_bad_names_are_refused(name):
    with pytest.raises(InvalidNameError):
        parse_model_name(name)


def test_roots(tmp_path, monkeypatch, store):
    monkeypatch.setenv("CTX_HOME", str(tmp_path / "ctx"))
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert ollama_roots() == [store]
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    assert ollama_roots() == []
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ollama" / "models" / "manifests").mkdir(parents=True)
    assert tmp_path / ".ollama" / "models" in ollama_roots()
    (tmp_path / "ctx" / "ollama" / "manifests").mkdir(parents=True)  # ctx pull ollama://'s own store
    assert ollama_roots()[-1] == tmp_path / "ctx" / "ollama"


# -- the catalog ------------------------------------------------------------------------
def test_every_manifest_is_listed(catalog):
    names = {e.name for e in catalog.entries()}
    assert names == {"smollm2:135m", "smollm2:latest", "someone/smol:q4", "localhost:5000/team/smol:v1",
                     "mamba:latest", "iquant:latest", "safetensors:latest", "adapter:latest", "badparams:latest",
                     "gone:latest", "garbage:latest", "notlora:latest", "otherarch:latest", "hotparams:latest",
                     "nostop:latest", "zeroctx:latest", "oddparams:latest"}  # not .../library/-bad/latest: no model's name
    assert all(e.source == "ollama" for e in catalog.entries())


@pytest.mark.parametrize("spelling, name", [
    ("smollm2:135m", "smollm2:135m"), ("SmolLM2:135M", "smollm2:135m"), ("library/smollm2:135m", "smollm2:135m"),
    ("registry.ollama.ai/library/smollm2:135m", "smollm2:135m"),
    ("https://registry.ollama.ai/library/smollm2:135m", "smollm2:135m"),
    ("smollm2", "smollm2:latest"), ("smollm2:latest", "smollm2:latest"), ("library/smollm2", "smollm2:latest"),
    ("library/smollm2:latest", "smollm2:latest"), ("registry.ollama.ai/library/smollm2:latest", "smollm2:latest"),
    ("someone/smol:q4", "someone/smol:q4"), ("registry.ollama.ai/someone/smol:q4", "someone/smol:q4"),
    ("localhost:5000/team/smol:v1", "localhost:5000/team/smol:v1"),
])
def test_all_spellings_resolve(catalog, spelling, name):
    assert catalog.get(spelling).name == name


@pytest.mark.parametrize("spelling", ["smol:q4", "someone/smol", "team/smol:v1", "smollm2:136m", "../smollm2"])
def test_other_names_do_not(catalog, spelling):
    assert catalog.lookup(spelling) is None
    with pytest.raises(ModelNotFoundError):
        catalog.get(spelling)


def test_layers_are_read(catalog, store, smollm2_path):
    e = catalog.get("smollm2:135m")
    assert e.servable and e.params == PARAMS and e.system == SYSTEM and e.template == TEMPLATE
    assert e.path.parent == store / "blobs" and e.path.name.startswith("sha256-")
    assert e.path.read_bytes()[:4] == b"GGUF" and e.size == smollm2_path.stat().st_size
    assert e.modified == manifest_path(store, "smollm2:135m").stat().st_mtime
    assert len(e.digest) == 64 and e.config["model_family"] == "llama"
    plain = catalog.get("smollm2")
    assert plain.servable and plain.params == {} and plain.system is None and plain.template is None
    assert plain.path == e.path  # one blob, two manifests


def test_adapter_layers_are_kept(catalog):
    e = catalog.get("adapter")  # served with its ADAPTER layer (tests/test_lora_ollama.py loads real ones)
    assert e.servable and len(e.adapters) == 1 and e.adapters[0].read_bytes()[:4] == b"GGUF"


def test_params_ollama_ignores_or_we_can_apply_are_servable(catalog):
    e = catalog.get("oddparams")  # unknown names ignored, as Ollama does; 64.0 is an integer
    assert e.servable and e.params["num_ctx"] == 64.0


@pytest.mark.parametrize("name, reason", [
    ("mamba", "architecture 'mamba' is not supported"),
    ("iquant", "tensor type IQ4_NL is not supported"),
    ("safetensors", "safetensors"),
    ("badparams", "params layer is not valid JSON"),
    # Listed as servable once, these failed every request with a 500 (a model's broken
    # defaults, or an adapter that could never load, found only at use).
    ("hotparams", "the params layer's 'temperature' must be a finite number, not 'hot'"),
    ("nostop", "the params layer's 'stop' must be a list of strings"),
    ("zeroctx", "'num_ctx' must be >= 1"),
    ("notlora", "its ADAPTER layer cannot be used: sha256-"),
    ("otherarch", "an adapter for architecture 'gemma3', and the model is 'llama'"),
    ("gone", "is missing"),
    ("garbage", "manifest is not valid JSON"),
])
def test_broken_entries_are_listed_with_the_reason(catalog, name, reason):
    e = catalog.get(name)
    assert not e.servable and e.path is None and reason in e.error


def test_a_path_that_names_no_model_is_not_listed(catalog):
    # Ollama skips what is no valid name; a stray .DS_Store was listed as a broken model.
    assert catalog.lookup("registry.ollama.ai/library/-bad/latest") is None
    assert not [e for e in catalog.entries() if "-bad" in e.name or "DS_Store" in e.name]


def test_a_bad_manifest_hides_nothing_else(tmp_path, smollm2_path):
    root = tmp_path / "models"
    make_ollama_store(root, "aaa", smollm2_path)
    make_ollama_store(root, "zzz", smollm2_path)
    manifest_path(root, "aaa").write_text('{"layers": [{"mediaType": "application/vnd.ollama.image.model", '
                                          '"digest": "sha256:../../../etc/passwd"}]}')
    cat = ModelCatalog()
    entries = add_ollama_models(cat, [root])
    assert [e.name for e in entries] == ["aaa:latest", "zzz:latest"]
    assert "not a sha256 digest" in cat.get("aaa").error and cat.get("zzz").servable


def test_a_short_blob_is_refused(tmp_path, smollm2_path):
    root = tmp_path / "models"
    small = tmp_path / "small.gguf"
    small.write_bytes(smollm2_path.read_bytes()[:1000])
    make_ollama_store(root, "short", small)
    m = json.loads(manifest_path(root, "short").read_text())
    m["layers"][0]["size"] += 1
    manifest_path(root, "short").write_text(json.dumps(m))
    cat = build_catalog(ollama=[root], packaged=False)
    assert "has 1000 bytes, the manifest says 1001" in cat.get("short").error


def test_license_and_refused_configs(tmp_path, smollm2_path):
    root = tmp_path / "models"
    make_ollama_store(root, "licensed", smollm2_path,
                      extra_layers=[("application/vnd.ollama.image.license", b"Apache License 2.0")])
    make_ollama_store(root, "vision", smollm2_path,
                      extra_layers=[("application/vnd.ollama.image.projector", b"clip")])
    make_ollama_store(root, "cloud", smollm2_path, config={"model_format": "gguf", "remote_host": "https://ollama.com:443"})
    make_ollama_store(root, "st", smollm2_path, config={"model_format": "safetensors"})
    cat = build_catalog(ollama=[root], packaged=False)
    assert cat.get("licensed").servable and cat.get("licensed").license == "Apache License 2.0"
    assert "vision projector" in cat.get("vision").error
    assert "cloud model served by https://ollama.com:443" in cat.get("cloud").error
    assert "model format 'safetensors' is not supported" in cat.get("st").error


def test_an_ollama_name_beats_a_packaged_alias(store):
    cat = build_catalog(ollama=[store])
    assert cat.get("smollm2:135m").source == "ollama"   # the packaged smollm2's alias gives way
    assert cat.get("smollm2").source == "packaged"      # a name keeps its entry
    assert cat.get("smollm2:latest").source == "ollama"
    assert cat.default.source == "packaged"


# -- ctxengine.load ---------------------------------------------------------------------
@pytest.fixture
def ollama_env(monkeypatch, store):
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    return store


def test_resolve_model_finds_ollama_names(ollama_env, smollm2_path):
    blob = resolve_model("someone/smol:q4")
    assert blob.parent == ollama_env / "blobs" and blob.read_bytes()[:4] == b"GGUF"
    assert resolve_model("registry.ollama.ai/someone/SMOL:q4") == blob
    assert resolve_model("smollm2:135m") == smollm2_path  # a known name comes first


@pytest.mark.parametrize("name, error, match", [
    ("mamba", UnsupportedModelError, "Ollama model 'mamba:latest' cannot be served: architecture 'mamba'"),
    ("gone:latest", UnsupportedModelError, "is missing"),
    ("nothere:latest", ModelNotFoundError, "nor a model in Ollama's store"),
    ("../nothere:latest", ModelNotFoundError, "neither"),
])
def test_load_refuses_clearly(ollama_env, name, error, match):
    with pytest.raises(error, match=match) as err:
        ce.load(name)
    assert isinstance(err.value, CtxError)


def test_load_an_ollama_model_and_generate(ollama_env, smollm2_path):
    def greedy(model) -> str:
        c = model.context("t")
        c.append(model.tokenize("The capital of France is"))
        return "".join(p.text for p in c.generate(max_tokens=8, temperature=0.0))

    from_store, from_file = ce.load("someone/smol:q4", threads=1), ce.load(smollm2_path, threads=1)
    assert from_store.path.parent == ollama_env / "blobs"
    assert from_store.weight_id == from_file.weight_id
    text = greedy(from_store)
    assert text.strip() and text == greedy(from_file)  # the same bytes give the same tokens


def test_a_model_argument_may_name_an_ollama_model(ollama_env):
    cat = build_catalog(["someone/smol:q4", "mamba", "smollm2:135m"], packaged=False)
    smol, mamba, known = cat.entries()
    assert (smol.name, smol.source, smol.servable) == ("someone/smol:q4", "ollama", True)
    assert (mamba.name, mamba.servable) == ("mamba:latest", False) and "architecture 'mamba'" in mamba.error
    assert (known.name, known.source) == ("smollm2:135m", "file")  # a known name comes first


def test_the_engine_asks_only_the_sources_it_is_given(ollama_env):
    """No import registers Ollama's store anywhere: the registry and catalog of
    engine/ know its names only when handed the source, as ce.load hands it."""
    import ctxengine.ollama  # noqa: F401  (importing it changes nothing)
    from ctxengine.engine import registry
    from ctxengine.ollama.store import OllamaSource

    with pytest.raises(ModelNotFoundError):
        registry.resolve_model("someone/smol:q4")
    assert registry.resolve_model("someone/smol:q4", sources=[OllamaSource()]) == resolve_model("someone/smol:q4")
    assert ModelCatalog().lookup("registry.ollama.ai/someone/smol:q4") is None
