"""The tokenizer against llama.cpp's ids for SmolLM2 (byte-level BPE) and Gemma 3
(SentencePiece), plus round trips, special tokens and streaming
(speed: bench/bench_tokenizer.py)."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.text.tokenizer import StreamDecoder, Tokenizer
from ctxengine.errors import TokenizerError


# smollm2_meta / gemma3_meta come from conftest.py (ctxengine's GGUF reader,
# which tests/test_gguf_file.py holds equal to gguf's GGUFReader).


@pytest.fixture(scope="session")
def smollm2(smollm2_meta):
    return Tokenizer.from_metadata(smollm2_meta)


@pytest.fixture(scope="session")
def gemma3(gemma3_meta):
    return Tokenizer.from_metadata(gemma3_meta)


@pytest.fixture(params=["smollm2", "gemma3"])
def model(request) -> tuple[Tokenizer, dict]:
    """(tokenizer, llama.cpp reference outputs) for each model."""
    return request.getfixturevalue(request.param), request.getfixturevalue(request.param + "_ref")


def _mismatches(cases: list[tuple[str, list[int], list[int]]]) -> str:
    return "\n".join(f"{text!r}:\n  ours  {got}\n  llama {want}" for text, got, want in cases)


# --- llama.cpp's ids ---------------------------------------------------------

def test_every_reference_tokenization_matches(model):
    tok, ref = model
    wrong = [(c["text"], tok.encode(c["text"]), c["ids"]) for c in ref["tokenize"]]
    wrong = [w for w in wrong if w[1] != w[2]]
    assert not wrong, _mismatches(wrong)


def test_teacher_and_greedy_prompts_match_with_the_models_bos(model):
    tok, ref = model
    cases = [(c["text"], c["ids"]) for c in ref["teacher"]]
    cases += [(c["prompt"], c["prompt_ids"]) for c in ref["greedy"]]
    wrong = [(text, tok.encode(text, add_bos=tok.add_bos), ids) for text, ids in cases]
    wrong = [w for w in wrong if w[1] != w[2]]
    assert not wrong, _mismatches(wrong)


def test_reference_texts_round_trip(model):
    tok, ref = model
    texts = [c["text"] for c in ref["tokenize"] + ref["teacher"]]
    texts += [c["prompt"] for c in ref["greedy"]]
    wrong = [(t, tok.decode(tok.encode(t))) for t in texts if tok.decode(tok.encode(t)) != t]
    assert not wrong, wrong


def test_bos_defaults_follow_the_metadata(smollm2, gemma3):
    assert (smollm2.add_bos, smollm2.bos_id, smollm2.eos_id) == (False, 1, 2)
    assert (gemma3.add_bos, gemma3.bos_id, gemma3.eos_id) == (True, 2, 1)
    assert gemma3.encode("Hi", add_bos=True)[0] == 2
    # add_bos asks for the specials the file wants, as llama.cpp's add_special: none for SmolLM2
    assert smollm2.encode("Hi", add_bos=True) == smollm2.encode("Hi") == [26843]


def test_end_of_generation_ids_as_llama_cpp_decides(smollm2, gemma3):
    # SmolLM2: <|endoftext|>, <|im_end|> (= eos) and <reponame>, which llama.cpp
    # takes for the FIM repo token. Gemma 3: <eos>, <end_of_turn> and "</s>",
    # which llama.cpp lists as an end-of-generation text (for PaddleOCR).
    assert smollm2.eog_ids == frozenset({0, 2, 4})
    assert gemma3.eog_ids == frozenset({1, 106, 212})


# --- special tokens ------------------------------------------------------------

def test_smollm2_control_tokens_are_parsed_only_when_asked(smollm2):
    text = "<|im_start|>user\nHi<|im_end|>\n"
    assert smollm2.encode(text, parse_special=True) == [1, *smollm2.encode("user\nHi"), 2,
                                                        *smollm2.encode("\n")]
    assert 1 not in smollm2.encode(text)
    assert smollm2.encode("<|im_start|>user", parse_special=True) == [1, *smollm2.encode("user")]


def test_gemma3_control_tokens_are_parsed_only_when_asked(gemma3):
    assert gemma3.encode("<start_of_turn>user", parse_special=True) == [105, *gemma3.encode("user")]
    assert 105 not in gemma3.encode("<start_of_turn>user")


def test_gemma3_user_defined_tokens_are_parsed_even_without_parse_special(gemma3):
    # llama.cpp cuts user-defined tokens out before anything else either way;
    # "\t" (255968) in the reference cases shows it too.
    assert gemma3.encode("<b>x</b>") == [200, *gemma3.encode("x"), 209]
    assert gemma3.encode("\t") == [255968]


def test_longer_special_tokens_win(gemma3):
    assert gemma3.encode("\n\n\n") == [109]
    assert gemma3.encode("<start_of_turn><end_of_turn>", parse_special=True) == [105, 106]


def test_control_tokens_render_as_text_unless_skipped(smollm2, gemma3):
    ids = smollm2.encode("<|im_start|>user", parse_special=True)
    assert smollm2.decode(ids) == "<|im_start|>user"
    assert smollm2.decode(ids, skip_special=True) == "user"
    assert smollm2.token_bytes(2) == b"<|im_end|>"
    assert smollm2.is_control(2) and not smollm2.is_control(ids[-1])
    assert gemma3.decode([2, *gemma3.encode("Hello")]) == "<bos>Hello"
    assert gemma3.decode([2, *gemma3.encode("Hello")], skip_special=True) == "Hello"
    assert gemma3.is_control(106) and not gemma3.is_control(200)


# --- bytes and streaming -------------------------------------------------------

def test_token_bytes_of_byte_tokens(gemma3):
    assert gemma3.token_bytes(238 + 0x41) == b"A"  # <0x41>
    assert gemma3.encode("\U00020000") == [238 + 0xF0, 238 + 0xA0, 238 + 0x80, 238 + 0x80]


def test_invalid_utf8_decodes_to_the_replacement_character(smollm2):
    first_byte_of_emoji = smollm2.encode("🙂")[:1]
    assert smollm2.decode(first_byte_of_emoji) == "\ufffd"


@pytest.mark.parametrize("text", ["emoji 🙂🚀 done 日本語", "\U00020000\U0002A700 ☃︎"])
def test_stream_decoder_holds_back_split_characters(model, text):
    tok, _ = model
    stream = StreamDecoder(tok)
    pieces = [stream.push(token_id) for token_id in tok.encode(text)] + [stream.flush()]
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)


@pytest.mark.parametrize("text", ["emoji 🙂🚀 done 日本語", "\U00020000\U0002A700 ☃︎"])
def test_a_stream_decoder_after_any_cut_finishes_the_character_the_cut_split(model, text):
    # A context's next generate() starts after the last one's tokens: a character they left
    # unfinished came out as U+FFFD in one and its other bytes as U+FFFD in the next.
    tok, _ = model
    ids = tok.encode(text)
    for cut in range(1, len(ids)):
        first = StreamDecoder(tok)
        head = "".join(first.push(t) for t in ids[:cut])
        rest = StreamDecoder(tok, after=ids[:cut])
        assert head + "".join(rest.push(t) for t in ids[cut:]) + rest.flush() == text, cut


def test_stream_decoder_flush_replaces_an_unfinished_character(smollm2):
    stream = StreamDecoder(smollm2)
    assert stream.push(smollm2.encode("🙂")[0]) == ""
    assert stream.flush() == "\ufffd"


# SmolLM2's vocabulary has no token for the bytes 0x04 0x06 0x13 0x14 0x16 0x1D,
# nor for 0xF1 0xF2 (which lead U+40000..U+BFFFF, all unassigned); llama.cpp
# drops such bytes, so those characters cannot round-trip.
_NOT_IN_SMOLLM2 = "\x04\x06\x13\x14\x16\x1d"


def test_bpe_drops_bytes_without_a_token_like_llama_cpp(smollm2):
    assert smollm2.encode("a\x04b") == smollm2.encode("a") + smollm2.encode("b")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), max_codepoint=0x3FFFF,
                                      blacklist_characters=_NOT_IN_SMOLLM2)))
def test_bpe_round_trips_any_text(smollm2, text):
    ids = smollm2.encode(text)
    assert smollm2.decode(ids) == text
    stream = StreamDecoder(smollm2)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == text


# "▁" is SentencePiece's own spelling of a space, so it decodes as " ".
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581")))
def test_spm_with_byte_fallback_round_trips_any_text(gemma3, text):
    ids = gemma3.encode(text)
    assert gemma3.decode(ids) == text
    stream = StreamDecoder(gemma3)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == text


# --- other pre-tokenizers ------------------------------------------------------

# Pre-tokenizer regexes as Hugging Face tokenizer.json files write them
# (default and falcon: llama.cpp's own lists, which check the regex engine).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
HF_PRE_TOKENIZERS = {
    "gpt-2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "llama-bpe": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen2": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+",
                       "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"],
}


@pytest.mark.parametrize("pre", sorted(HF_PRE_TOKENIZERS))
def test_other_pre_tokenizers_split_like_hugging_face(smollm2_meta, pre):
    """The same vocabulary and merges under other tokenizer.ggml.pre values,
    against the tokenizers package running the original regexes."""
    hf = pytest.importorskip("tokenizers")
    tok = Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.pre": pre})
    vocab = {text: i for i, text in enumerate(smollm2_meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in smollm2_meta["tokenizer.ggml.merges"]]
    reference = hf.Tokenizer(hf.models.BPE(vocab=vocab, merges=merges,
                                           ignore_merges=pre == "llama-bpe"))
    reference.pre_tokenizer = hf.pre_tokenizers.Sequence(
        [hf.pre_tokenizers.Split(hf.Regex(p), behavior="isolated") for p in HF_PRE_TOKENIZERS[pre]]
        + [hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    rng = random.Random(0)
    alphabet = list("abXY éü日本🙂'sStTlLdD \t\n\r123٣¼.,!?-_()<>|~$+`^=«—€"
                    "\xa0\u2009\u3000\u0301\x1c\x85")
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(500)]
    wrong = [(t, tok.encode(t), reference.encode(t, add_special_tokens=False).ids) for t in texts]
    wrong = [w for w in wrong if w[1] != w[2]]
    assert not wrong, _mismatches(wrong[:5])


# --- errors ----------------------------------------------------------------------

def test_unknown_pre_tokenizer_is_named(smollm2_meta):
    with pytest.raises(TokenizerError, match="'no-such-pre'"):
        Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.pre": "no-such-pre"})


def test_unsupported_tokenizer_model_is_named(smollm2_meta):
    with pytest.raises(TokenizerError, match="'t5'"):
        Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.model": "t5"})


def test_missing_merges_and_duplicate_tokens_are_refused(smollm2_meta):
    no_merges = {k: v for k, v in smollm2_meta.items() if k != "tokenizer.ggml.merges"}
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges"):
        Tokenizer.from_metadata(no_merges)
    tokens = list(smollm2_meta["tokenizer.ggml.tokens"])
    tokens[5] = tokens[4]
    with pytest.raises(TokenizerError, match="duplicate token"):
        Tokenizer.from_metadata({**smollm2_meta, "tokenizer.ggml.tokens": tokens})


def test_out_of_range_ids_are_refused(smollm2):
    with pytest.raises(TokenizerError, match="out of range"):
        smollm2.decode([smollm2.n_vocab])
