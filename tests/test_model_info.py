"""/api/show's model_info and details for SmolLM2, checked against the file as
gguf's own reader sees it, and validated by the ollama client's models."""
import json
import math

import numpy as np
import pytest
from gguf import GGUFReader
from ollama._types import ModelDetails, ShowResponse

from ctxengine.engine.model_source import CatalogEntry
from ctxengine.serving.catalog import build_catalog
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.ollama.model_info import details, file_type_name, model_info, parameter_size_text
from ollama_layout import make_ollama_store


@pytest.fixture(scope="module")
def reader(smollm2_path):
    return GGUFReader(smollm2_path)  # an independent parser


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with open_gguf(smollm2_path) as f:
        yield f


def _field(reader, key):
    return reader.fields[key].contents()


def test_model_info_is_the_files_metadata(smollm2, reader):
    info = model_info(smollm2)
    json.dumps(info, allow_nan=False)  # JSON as it is
    for key in ("general.architecture", "general.file_type", "llama.context_length", "llama.embedding_length",
                "llama.block_count", "llama.attention.head_count", "llama.attention.head_count_kv",
                "llama.feed_forward_length", "llama.rope.dimension_count", "llama.vocab_size",
                "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id", "general.basename", "general.size_label"):
        assert info[key] == _field(reader, key), key
    assert (info["general.architecture"], info["llama.context_length"], info["llama.embedding_length"],
            info["general.file_type"], info["tokenizer.ggml.model"]) == ("llama", 8192, 576, 3, "gpt2")
    assert info["llama.rope.freq_base"] == 100000.0
    assert info["llama.attention.layer_norm_rms_epsilon"] == 1e-05  # float32 spelled as float32
    assert np.float32(info["llama.attention.layer_norm_rms_epsilon"]) == np.float32(
        _field(reader, "llama.attention.layer_norm_rms_epsilon"))


def test_parameter_count_is_every_tensors_elements(smollm2, reader):
    expected = sum(int(np.prod(t.shape)) for t in reader.tensors)
    assert model_info(smollm2)["general.parameter_count"] == expected == 134515008


def test_arrays_are_null_and_some_keys_hidden_unless_verbose(smollm2, reader):
    info = model_info(smollm2)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "general.languages"):
        assert key in info and info[key] is None, key
    assert "general.name" not in info and "tokenizer.chat_template" not in info
    verbose = model_info(smollm2, verbose=True)
    assert len(verbose["tokenizer.ggml.tokens"]) == 49152
    assert verbose["tokenizer.ggml.tokens"][:5] == _field(reader, "tokenizer.ggml.tokens")[:5]
    assert verbose["tokenizer.ggml.token_type"][:3] == list(_field(reader, "tokenizer.ggml.token_type")[:3])
    json.dumps(verbose["tokenizer.ggml.token_type"][:10])


def test_details_from_the_file(smollm2):
    d = details(None, smollm2)
    assert d == {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                 "parameter_size": "134.52M", "quantization_level": "Q4_1"}
    assert ModelDetails(**d).quantization_level == "Q4_1"


def test_details_from_an_ollama_config(tmp_path, smollm2_path, smollm2):
    make_ollama_store(tmp_path, "custom", smollm2_path, config={
        "model_format": "gguf", "model_family": "smol", "model_families": ["smol", "llama"],
        "model_type": "135M", "file_type": "unknown"})
    entry = build_catalog(ollama=[tmp_path], packaged=False).get("custom")
    d = details(entry, smollm2)
    assert d["family"] == "smol" and d["families"] == ["smol", "llama"] and d["parameter_size"] == "135M"
    assert d["quantization_level"] == "Q4_1"  # "unknown" in the config: taken from the file, as Ollama does
    ModelDetails(**d)
    show = ShowResponse(model_info=model_info(smollm2), details=d, template="{{ .Prompt }}",
                        modified_at="2025-01-01T00:00:00Z")
    assert show.modelinfo["general.architecture"] == "llama"


def test_details_of_a_store_entry_match_what_ollama_create_writes(tmp_path, smollm2_path, smollm2):
    make_ollama_store(tmp_path, "smollm2:135m", smollm2_path)  # config computed as server/create.go does
    entry = build_catalog(ollama=[tmp_path], packaged=False).get("smollm2:135m")
    assert details(entry, smollm2) == details(CatalogEntry("x", smollm2_path, "file"), smollm2)


@pytest.mark.parametrize("n, text", [  # format/format_test.go TestHumanNumber
    (0, "0"), (999, "999"), (1000, "1K"), (1001, "1K"), (1000000, "1M"), (125000000, "125M"),
    (500500000, "500.50M"), (500550000, "500.55M"), (1000000000, "1B"), (2800000000, "2.8B"),
    (2850000000, "2.9B"), (1000000000000, "1000B"), (134515008, "134.52M")])
def test_parameter_size_text(n, text):
    assert parameter_size_text(n) == text


def test_file_type_names():
    assert [file_type_name(v) for v in (0, 1, 2, 3, 7, 15, 32, 4, None, "3", True)] == [
        "F32", "F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K_M", "BF16", "unknown", "unknown", "unknown", "unknown"]
    assert math.isclose(float(parameter_size_text(1_500_000_000)[:-1]), 1.5)
