"""Text <-> token ids from a GGUF file's ``tokenizer.ggml.*`` metadata, the way
llama.cpp's llama-vocab.cpp does it, so that ids match its ids exactly.

Encoding has two stages. First the special tokens are cut out of the text
(:meth:`Tokenizer._partition`); then each remaining text fragment goes to the
model's encoder: byte-level BPE (``tokenizer_bpe``) or SentencePiece BPE by
scores (``tokenizer_spm``).
"""
from __future__ import annotations

import codecs
from collections.abc import Mapping, Sequence
from typing import Any

import regex

from ctxengine.engine import tokenizer_bpe, tokenizer_spm
from ctxengine.errors import TokenizerError

# llama_token_attr bits, from tokenizer.ggml.token_type (llama_token_type).
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = (1 << i for i in range(6))
_ATTR_OF_TYPE = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}
_SPECIAL = CONTROL | UNKNOWN  # rendered and parsed only when asked for

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
_DEFAULT_BOS_EOS = {"llama": (1, 2), "gpt2": (11, 11)}


class Tokenizer:
    """A GGUF vocabulary. Build it with :meth:`from_metadata`."""

    def __init__(self, *, texts: list[str], attrs: list[int], pieces: list[bytes],
                 encoder: tokenizer_bpe.BpeEncoder | tokenizer_spm.SpmEncoder,
                 bos_id: int | None, eos_id: int | None, add_bos: bool,
                 add_space_prefix: bool, eog_ids: frozenset[int]):
        self.n_vocab = len(texts)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.eog_ids = eog_ids
        self._texts = texts
        self._attrs = attrs
        self._pieces = pieces  # token_to_piece(special=True) of every id
        self._encoder = encoder
        self._add_space_prefix = add_space_prefix
        self._specials = _SpecialTokens(texts, attrs)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF key -> value (arrays as lists), as llama_vocab::load does."""
        model = _get(meta, "tokenizer.ggml.model", str)
        if model not in _DEFAULT_BOS_EOS:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.model {model!r}: only 'gpt2' (byte-level BPE) "
                "and 'llama' (SentencePiece) are supported")
        texts = _token_texts(meta)
        token_to_id = _index(texts)
        attrs = _token_attrs(meta, len(texts))
        ids = _special_ids(meta, model, len(texts))
        eog_ids = _end_of_generation(texts, token_to_id, attrs, ids)

        # SentencePiece puts a space in front by default; BPE never does, but
        # llama.cpp's detokenizer still strips the leading space by this key.
        add_space_prefix = _get(meta, "tokenizer.ggml.add_space_prefix", bool, model == "llama")
        if model == "gpt2":
            pre = tokenizer_bpe.pre_tokenizer(_get(meta, "tokenizer.ggml.pre", str, None))
            ranks = tokenizer_bpe.parse_merges(_get(meta, "tokenizer.ggml.merges", list))
            encoder = tokenizer_bpe.BpeEncoder(token_to_id, ranks, pre)
            add_bos = pre.add_bos
            pieces = [_bpe_piece(text, attr) for text, attr in zip(texts, attrs)]
        else:
            byte_ids = tokenizer_spm.byte_token_ids(token_to_id)
            encoder = tokenizer_spm.SpmEncoder(
                token_to_id, _scores(meta, len(texts)), byte_ids, add_space_prefix)
            add_bos = True
            pieces = [_spm_piece(text, attr) for text, attr in zip(texts, attrs)]
        add_bos = _get(meta, "tokenizer.ggml.add_bos_token", bool, add_bos)
        if add_bos and ids["bos"] is None:
            raise TokenizerError("tokenizer.ggml.add_bos_token is true, but there is no BOS token")
        return cls(texts=texts, attrs=attrs, pieces=pieces, encoder=encoder,
                   bos_id=ids["bos"], eos_id=ids["eos"], add_bos=add_bos,
                   add_space_prefix=add_space_prefix, eog_ids=eog_ids)

    def with_bos(self, ids: list[int]) -> list[int]:
        """``ids`` as the start of a sequence: with the BOS token in front if the
        model wants one and it is not there yet (a rendered chat template may
        already begin with it)."""
        if self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            return [self.bos_id, *ids]
        return ids

    def encode(self, text: str, *, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``. Control tokens are recognised in the text only
        with ``parse_special``; user-defined tokens always are (as in llama.cpp).
        A lone surrogate goes in as the three bytes that UTF-8 would spell it
        with, which llama.cpp reads back as that code point."""
        ids: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise TokenizerError("this vocabulary has no BOS token")
            ids.append(self.bos_id)
        after_special = True
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
            else:
                ids.extend(self._encoder.encode(fragment, after_special))
                after_special = False
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of ``ids`` (llama_detokenize without its BPE space clean-up, which
        would make decoding lossy). Invalid UTF-8 becomes U+FFFD."""
        ids = list(ids)
        # llama.cpp drops a leading space the SentencePiece encoder put in front;
        # with skip_special it drops a leading BOS instead and keeps the space.
        strip_space = self._add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            ids = ids[1:]
            strip_space = False
        pieces = [self._piece(token_id, skip_special) for token_id in ids]
        if strip_space and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for; a control token's are its text."""
        return self._pieces[self._checked(token_id)]

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[self._checked(token_id)] & CONTROL)

    def _piece(self, token_id: int, skip_special: bool) -> bytes:
        token_id = self._checked(token_id)
        if skip_special and self._attrs[token_id] & _SPECIAL:
            return b""
        return self._pieces[token_id]

    def _checked(self, token_id: int) -> int:
        if not 0 <= token_id < self.n_vocab:
            raise TokenizerError(f"token id {token_id} is out of range (n_vocab {self.n_vocab})")
        return token_id

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """``text`` as raw-text fragments and special-token ids, in order.

        llama.cpp's tokenizer_st_partition: special tokens are taken longest
        first, each one cut out of every raw fragment left at its turn. Only
        the tokens that occur in ``text`` are tried, which changes nothing."""
        fragments: list[str | int] = [text] if text else []
        for token_id in self._specials.occurring_in(text, parse_special):
            needle = self._texts[token_id]
            fragments = [part for fragment in fragments
                         for part in _cut(fragment, needle, token_id)]
        return fragments


class _SpecialTokens:
    """The control, user-defined and unknown tokens, in llama.cpp's matching order
    (longest UTF-8 text first), with a trie to find which ones occur in a text."""

    _END = ""  # trie key marking that a token ends at this node

    def __init__(self, texts: Sequence[str], attrs: Sequence[int]):
        ids = [i for i, attr in enumerate(attrs) if attr & (CONTROL | USER_DEFINED | UNKNOWN)]
        self._order = {token_id: rank for rank, token_id in enumerate(
            sorted(ids, key=lambda i: (-len(_text_bytes(texts[i])), i)))}
        self._parsed_always = frozenset(i for i in ids if not attrs[i] & _SPECIAL)
        self._trie: dict = {}
        for token_id in ids:
            node = self._trie
            for char in texts[token_id]:
                node = node.setdefault(char, {})
            node[self._END] = token_id
        first_chars = "".join(sorted(self._trie))
        self._starts = regex.compile(f"[{regex.escape(first_chars)}]") if first_chars else None

    def occurring_in(self, text: str, parse_special: bool) -> list[int]:
        if self._starts is None:
            return []
        found = set()
        for start in self._starts.finditer(text):
            node = self._trie
            for i in range(start.start(), len(text)):
                node = node.get(text[i])
                if node is None:
                    break
                if self._END in node:
                    found.add(node[self._END])
        if not parse_special:
            found &= self._parsed_always
        return sorted(found, key=self._order.__getitem__)


def _cut(fragment: str | int, needle: str, token_id: int) -> list[str | int]:
    """``fragment`` with every occurrence of ``needle``, left to right, replaced by ``token_id``."""
    if isinstance(fragment, int):
        return [fragment]
    parts: list[str | int] = []
    done = 0
    while (hit := fragment.find(needle, done)) >= 0:
        if hit > done:
            parts.append(fragment[done:hit])
        parts.append(token_id)
        done = hit + len(needle)
    if done < len(fragment):
        parts.append(fragment[done:])
    return parts


class StreamDecoder:
    """Incremental detokenization: text comes out as soon as its UTF-8 is complete."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that became complete with ``token_id`` (may be "")."""
        return self._utf8.decode(self._tokenizer._piece(token_id, self._skip_special))

    def flush(self) -> str:
        """What is held back at the end: an incomplete sequence becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)


# --- reading the metadata ----------------------------------------------------

_MISSING = object()


def _get(meta: Mapping[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
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


def _token_texts(meta: Mapping[str, Any]) -> list[str]:
    texts = _get(meta, "tokenizer.ggml.tokens", list)
    if not texts:
        raise TokenizerError("tokenizer.ggml.tokens is empty")
    if not all(isinstance(t, str) for t in texts):
        raise TokenizerError("tokenizer.ggml.tokens must be an array of strings")
    # llama.cpp renames empty tokens so that every text is a unique key.
    return [t or f"[EMPTY_{i}]" for i, t in enumerate(texts)]


def _index(texts: Sequence[str]) -> dict[str, int]:
    token_to_id = {text: i for i, text in enumerate(texts)}
    if len(token_to_id) != len(texts):
        seen: dict[str, int] = {}
        for i, text in enumerate(texts):
            if text in seen:
                raise TokenizerError(
                    f"duplicate token in vocabulary: {text!r} has ids {seen[text]} and {i}")
            seen[text] = i
    return token_to_id


def _token_attrs(meta: Mapping[str, Any], n_vocab: int) -> list[int]:
    types = _get(meta, "tokenizer.ggml.token_type", list, None)
    if types is None:
        return [NORMAL] * n_vocab
    if len(types) < n_vocab:
        raise TokenizerError(
            f"tokenizer.ggml.token_type has {len(types)} entries for {n_vocab} tokens")
    return [_ATTR_OF_TYPE.get(int(t), 0) for t in types[:n_vocab]]


def _scores(meta: Mapping[str, Any], n_vocab: int) -> list[float]:
    scores = _get(meta, "tokenizer.ggml.scores", list, None)
    if scores is None:
        return [0.0] * n_vocab
    if len(scores) < n_vocab:
        raise TokenizerError(
            f"tokenizer.ggml.scores has {len(scores)} entries for {n_vocab} tokens")
    return [float(s) for s in scores[:n_vocab]]


def _special_ids(meta: Mapping[str, Any], model: str, n_vocab: int) -> dict[str, int | None]:
    """bos, eos, eot, eom and the FIM ids set in the metadata (or defaulted).
    An out-of-range default is dropped and an out-of-range key is ignored."""
    bos, eos = _DEFAULT_BOS_EOS[model]
    ids: dict[str, int | None] = {"bos": bos, "eos": eos, "eot": None, "eom": None,
                                  **dict.fromkeys(_FIM_TEXTS)}
    keys = {name: [name] for name in ids}
    for fim, old in _FIM_DEPRECATED_KEY.items():
        keys[fim].append(old)
    for name, suffixes in keys.items():
        if ids[name] is not None and ids[name] >= n_vocab:
            ids[name] = None
        for suffix in suffixes:
            value = _get(meta, f"tokenizer.ggml.{suffix}_token_id", int, None)
            if value is not None and 0 <= value < n_vocab:
                ids[name] = value
    return ids


def _end_of_generation(texts: Sequence[str], token_to_id: Mapping[str, int],
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


# --- token pieces (llama_vocab::token_to_piece with special=true) -------------

def _text_bytes(text: str) -> bytes:
    """A token text's bytes. GGUF strings may hold invalid UTF-8 (byte fragments);
    the GGUF reader keeps those bytes as surrogateescape surrogates."""
    return text.encode("utf-8", "surrogateescape")


def _bpe_piece(text: str, attr: int) -> bytes:
    if attr & (CONTROL | UNKNOWN | USER_DEFINED):
        return _text_bytes(text)
    if attr & NORMAL:
        try:
            return bytes(tokenizer_bpe.CHAR_TO_BYTE[c] for c in text)
        except KeyError:
            return _undecodable(text)
    if attr & BYTE:
        return bytes([int(text[3:5], 16)])
    return b""  # unused and undefined tokens render as nothing


def _undecodable(text: str) -> bytes:
    """llama_decode_text's spelling of a normal token with a character outside
    the byte alphabet: each such character becomes "[UNK_BYTE_0x<hex><token>]"."""
    token = _text_bytes(text)
    out = bytearray()
    for c in text:
        if c in tokenizer_bpe.CHAR_TO_BYTE:
            out.append(tokenizer_bpe.CHAR_TO_BYTE[c])
        else:
            utf8_hex = _text_bytes(c).hex().encode()
            out += b"[UNK_BYTE_0x" + utf8_hex + token + b"]"
    return bytes(out)


def _spm_piece(text: str, attr: int) -> bytes:
    if attr & (CONTROL | UNKNOWN | USER_DEFINED):
        return _text_bytes(text)
    if attr & NORMAL:
        return _text_bytes(text.replace(tokenizer_spm.SPACE, " "))
    if attr & BYTE:
        return bytes([int(text[3:5], 16)])
    return b""  # unused and undefined tokens render as nothing
