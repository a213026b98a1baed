"""Which file of a Hugging Face repo a name means (engine/hf_files.py), as llama.cpp's -hf picks it."""
import pytest

from ctxengine.engine.hf_files import choose, is_hf_spec, model_choices, parse_hf_spec
from ctxengine.errors import InvalidNameError, ModelNotFoundError

REPO = ["README.md", "Qwen3-0.6B-Q4_K_M.gguf", "Qwen3-0.6B-Q4_K_S.gguf", "Qwen3-0.6B-Q8_0.gguf",
        "Qwen3-0.6B-f16-00001-of-00002.gguf", "Qwen3-0.6B-f16-00002-of-00002.gguf", "mmproj-Qwen3-f16.gguf"]


def pick(spec: str, files=REPO) -> tuple[str, ...]:
    return choose(parse_hf_spec(spec), files).files


def test_spellings():
    for s in ("hf://org/repo:Q4_K_M", "hf.co/org/repo:Q4_K_M", "HF://org/repo:Q4_K_M"):
        assert is_hf_spec(s)
        spec = parse_hf_spec(s)
        assert (spec.repo, spec.tag, spec.file) == ("org/repo", "Q4_K_M", None)
        assert spec.name == "hf.co/org/repo:Q4_K_M"
    assert parse_hf_spec("org/repo:q8_0").tag == "q8_0"  # -hf's spelling, no scheme
    assert parse_hf_spec("hf://org/repo/sub/x.gguf").file == "sub/x.gguf"
    assert not is_hf_spec("smollm2:135m")


@pytest.mark.parametrize("bad", ["hf://org", "hf://org/repo:", "hf://../x:q", "hf://org/repo/x.bin",
                                 "hf://org/repo/../x.gguf",
                                 # the Hub's own rules: huggingface_hub raised them as a traceback
                                 "hf://org/a--b", "hf://org/a..b:q4_0", "hf://org/" + "a" * 100])
def test_bad_specs_refused(bad):
    with pytest.raises(InvalidNameError):
        parse_hf_spec(bad)


def test_quant_matched_case_insensitively_as_a_whole_token():
    assert pick("hf://o/r:q4_k_m") == ("Qwen3-0.6B-Q4_K_M.gguf",)
    assert pick("hf://o/r:Q8_0") == ("Qwen3-0.6B-Q8_0.gguf",)


def test_no_tag_means_q4_k_m_or_the_only_model():
    assert pick("hf://o/r") == ("Qwen3-0.6B-Q4_K_M.gguf",)
    assert pick("hf://o/r", ["a.gguf", "mmproj-a.gguf"]) == ("a.gguf",)


def test_ambiguous_tag_lists_the_matches():
    with pytest.raises(ModelNotFoundError, match="ambiguous.*Q4_K_M.gguf, Qwen3-0.6B-Q4_K_S.gguf"):
        pick("hf://o/r:Q4_K")


def test_absent_tag_lists_every_model():
    with pytest.raises(ModelNotFoundError, match=r"quant 'Q2_K'.*Q4_K_M.gguf.*Q8_0.gguf.*f16-00001-of-00002.gguf \(\+1 parts\)"):
        pick("hf://o/r:Q2_K")
    with pytest.raises(ModelNotFoundError, match="no quant given and no Q4_K_M"):
        pick("hf://o/r", ["a-Q8_0.gguf", "a-Q6_K.gguf"])


def test_split_set_is_one_choice_and_projectors_none():
    firsts = [c.first for c in model_choices(REPO)]
    assert "Qwen3-0.6B-f16-00002-of-00002.gguf" not in firsts and not any("mmproj" in f for f in firsts)
    assert pick("hf://o/r:F16") == ("Qwen3-0.6B-f16-00001-of-00002.gguf", "Qwen3-0.6B-f16-00002-of-00002.gguf")
    incomplete = [f for f in REPO if "00002-of" not in f]
    assert all("f16" not in c.first for c in model_choices(incomplete))


def test_file_by_path():
    assert pick("hf://o/r/Qwen3-0.6B-Q8_0.gguf") == ("Qwen3-0.6B-Q8_0.gguf",)
    with pytest.raises(ModelNotFoundError, match="has no file nope.gguf"):
        pick("hf://o/r/nope.gguf")


def test_latest_is_no_tag_and_names_leading_out_are_never_a_choice():
    spec = parse_hf_spec("hf://o/r:latest")
    assert spec.tag is None and parse_hf_spec(spec.name) == spec  # the name a pull lists parses back
    assert choose(parse_hf_spec("hf://o/r:LATEST"), ["m-Q4_K_M.gguf"]).first == "m-Q4_K_M.gguf"
    hostile = ["../evil-Q4_K_M.gguf", "/abs-Q4_K_M.gguf", "a/./b-Q4_K_M.gguf", "a//b-Q4_K_M.gguf"]
    with pytest.raises(ModelNotFoundError, match="no whole GGUF model"):
        choose(parse_hf_spec("hf://o/r:Q4_K_M"), hostile)
    assert choose(parse_hf_spec("hf://o/r:Q4_K_M"), [*hostile, "ok/m-Q4_K_M.gguf"]).first == "ok/m-Q4_K_M.gguf"
