"""A model split into several GGUF files (gguf-split's format, written by the
gguf package's writer from the real SmolLM2) opens by its first part as one
model: the same tensors, the same weight id, the same tokens generated."""
import shutil

import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.catalog import ModelCatalog
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.engine.weights import cached_weight_id
from ctxengine.errors import ModelFileError
from gguf_splits import write_split

PREFIX = "SmolLM2-135M-Instruct-Q4_1"


@pytest.fixture(scope="module")
def parts(smollm2_path, tmp_path_factory):
    return write_split(smollm2_path, tmp_path_factory.mktemp("split"), PREFIX, 3)


def test_parts_as_gguf_split_writes_them(parts):
    assert [p.name for p in parts] == [f"{PREFIX}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with open_gguf(parts[0]) as f:
        assert (f.get("split.no"), f.get("split.count")) == (0, 3)
        assert len(f.parts) == 2 and [p.get("split.no") for p in f.parts] == [1, 2]


def test_split_set_reads_as_the_unsplit_file(parts, smollm2_path, monkeypatch, tmp_path):
    monkeypatch.setenv("CTX_HOME", str(tmp_path))
    with open_gguf(parts[0]) as split, open_gguf(smollm2_path) as whole:
        assert list(split.tensors) == list(whole.tensors)
        for name, t in whole.tensors.items():
            s = split.tensors[name]
            assert (s.ggml_type, s.shape) == (t.ggml_type, t.shape)
            assert np.array_equal(s.data, t.data), name
        assert {k: v for k, v in split.metadata.items() if not k.startswith("split.")} == whole.metadata
    assert cached_weight_id(parts[0]) == cached_weight_id(smollm2_path)


def test_split_model_generates_as_the_unsplit(parts, smollm2_path):
    def greedy(path):
        model = ce.load(str(path), threads=1)
        ctx = model.context("c")
        ctx.append("The capital of France is")
        return [p.token_id for p in ctx.generate(max_tokens=6, temperature=0.0)]

    assert greedy(parts[0]) == greedy(smollm2_path)


def test_later_part_alone_is_refused_by_name(parts):
    with pytest.raises(ModelFileError, match="part 2 of a split model; open its first part"):
        open_gguf(parts[1])


def test_missing_part_is_named(parts, tmp_path):
    for p in parts[:2]:
        shutil.copy(p, tmp_path / p.name)
    with pytest.raises(ModelFileError, match=f"part {PREFIX}-00003-of-00003.gguf is missing"):
        open_gguf(tmp_path / parts[0].name)


def test_renamed_first_part_cannot_find_the_others(parts, tmp_path):
    (tmp_path / "model.gguf").symlink_to(parts[0])
    with pytest.raises(ModelFileError, match="must be named PREFIX-00001-of-00003.gguf"):
        open_gguf(tmp_path / "model.gguf")


def test_models_dir_lists_a_split_model_once(parts):
    entries = ModelCatalog.build(models_dir=parts[0].parent, packaged=False).entries()
    assert [(e.name, e.servable) for e in entries] == [(f"{PREFIX}-00001-of-00003", True)]
