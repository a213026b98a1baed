"""What a GGUF's ``tokenizer.ggml.*`` keys say about its vocabulary, read as
llama.cpp's llama_vocab::load reads them: token texts and attributes, scores,
the special ids (BOS, EOS, EOT, FIM...) and which tokens end a generation.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import TokenizerError

# llama_token_attr bits, from tokenizer.ggml.token_type (llama_token_type).
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = (1 << i for i in range(6))
_ATTR_OF_TYPE = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}
SPECIAL = CONTROL | UNKNOWN  # rendered and parsed only when asked for

# Tokens llama.cpp treats as end of generation because of their text.
_EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
    "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
])
# Fill-in-the-middle tokens: metadata key suffix -> texts looked for when the key
# is absent. The pad, repo and file-separator ones also end generation.
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_FIM_EOG = ("fim_pad", "fim_rep", "fim_sep")
_FIM_DEPRECATED_KEY = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}

# tokenizer.ggml.model -> llama.cpp's default (bos, eos) ids for it.
DEFAULT_BOS_EOS = {"llama": (1, 2), "gpt2": (11, 11)}


_MISSING = object()


def get(meta: Mapping[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    value = meta.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise TokenizerError(f"the model has no {key}")
        return default
    if kind is list:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise TokenizerError(f"{key} must be an array")
        return list(value)
    if kind is int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TokenizerError(f"{key} must be an integer, not {value!r}")
        return int(value)
    if not isinstance(value, kind):
        raise TokenizerError(f"{key} must be a {kind.__name__}, not {value!r}")
    return value


def token_texts(meta: Mapping[str, Any]) -> list[str]:
    texts = get(meta, "tokenizer.ggml.tokens", list)
    if not texts:
        raise TokenizerError("tokenizer.ggml.tokens is empty")
    if not all(isinstance(t, str) for t in texts):
        raise TokenizerError("tokenizer.ggml.tokens must be an array of strings")
    # llama.cpp renames empty tokens so that every text is a unique key.
    return [t or f"[EMPTY_{i}]" for i, t in enumerate(texts)]


def index(texts: Sequence[str]) -> dict[str, int]:
    token_to_id = {text: i for i, text in enumerate(texts)}
    if len(token_to_id) != len(texts):
        seen: dict[str, int] = {}
        for i, text in enumerate(texts):
            if text in seen:
                raise TokenizerError(
                    f"duplicate token in vocabulary: {text!r} has ids {seen[text]} and {i}")
            seen[text] = i
    return token_to_id


def token_attrs(meta: Mapping[str, Any], n_vocab: int) -> list[int]:
    types = get(meta, "tokenizer.ggml.token_type", list, None)
    if types is None:
        return [NORMAL] * n_vocab
    if len(types) < n_vocab:
        raise TokenizerError(
            f"tokenizer.ggml.token_type has {len(types)} entries for {n_vocab} tokens")
    types = types[:n_vocab]
    if not set(map(type, types)) <= {int}:  # one pass in C: Gemma has 262k types
        i, bad = next((i, t) for i, t in enumerate(types) if type(t) is not int)
        raise TokenizerError(f"tokenizer.ggml.token_type[{i}] is {_shown(bad)}, not an integer")
    # An unknown type gives a token of no kind (llama.cpp's LLAMA_TOKEN_ATTR_UNDEFINED).
    return [_ATTR_OF_TYPE.get(t, 0) for t in types]


def scores(meta: Mapping[str, Any], n_vocab: int) -> list[float]:
    scores = get(meta, "tokenizer.ggml.scores", list, None)
    if scores is None:
        return [0.0] * n_vocab
    if len(scores) < n_vocab:
        raise TokenizerError(
            f"tokenizer.ggml.scores has {len(scores)} entries for {n_vocab} tokens")
    scores = scores[:n_vocab]
    if not set(map(type, scores)) <= {float, int}:
        i, bad = next((i, s) for i, s in enumerate(scores) if type(s) not in (float, int))
        raise TokenizerError(f"tokenizer.ggml.scores[{i}] is {_shown(bad)}, not a number")
    return [float(s) for s in scores]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def special_ids(meta: Mapping[str, Any], model: str, n_vocab: int) -> dict[str, int | None]:
    """bos, eos, eot, eom and the FIM ids set in the metadata (or defaulted).
    An out-of-range default is dropped and an out-of-range key is ignored."""
    bos, eos = DEFAULT_BOS_EOS[model]
    ids: dict[str, int | None] = {"bos": bos, "eos": eos, "eot": None, "eom": None,
                                  **dict.fromkeys(_FIM_TEXTS)}
    keys = {name: [name] for name in ids}
    for fim, old in _FIM_DEPRECATED_KEY.items():
        keys[fim].append(old)
    for name, suffixes in keys.items():
        if ids[name] is not None and ids[name] >= n_vocab:
            ids[name] = None
        for suffix in suffixes:
            value = get(meta, f"tokenizer.ggml.{suffix}_token_id", int, None)
            if value is not None and 0 <= value < n_vocab:
                ids[name] = value
    return ids


def end_of_generation(texts: Sequence[str], token_to_id: Mapping[str, int],
                       attrs: list[int], ids: dict[str, int | None]) -> frozenset[int]:
    """The end-of-generation ids. Like llama.cpp, this finds unset FIM tokens and
    the EOG tokens by their text, and makes every token it finds a control token
    (``attrs`` is updated)."""
    for name, candidates in _FIM_TEXTS.items():
        if ids[name] is None:
            # llama.cpp takes the first hit of a hash-map walk; the lowest id is
            # the same whenever a vocabulary has one candidate, and deterministic.
            found = [token_to_id[t] for t in candidates if t in token_to_id]
            if found:
                ids[name] = min(found)
                attrs[ids[name]] |= CONTROL
    eog = {ids[name] for name in _FIM_EOG if ids[name] is not None}
    for text in _EOG_TEXTS:
        token_id = token_to_id.get(text)
        if token_id is not None:
            eog.add(token_id)
            attrs[token_id] |= CONTROL
    eog.update(ids[name] for name in ("eos", "eot", "eom") if ids[name] is not None)
    # o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
    present = {texts[i] for i in eog}
    if "<|end|>" in present and (
            {"<|return|>", "<|call|>"} <= present or {"<|calls|>", "<|flush|>"} <= present):
        end_id = token_to_id["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = USER_DEFINED
    return frozenset(eog)
