"""Text <-> token ids from a GGUF file's ``tokenizer.ggml.*`` metadata, the way
llama.cpp's llama-vocab.cpp does it, so that ids match its ids exactly.

Encoding has two stages. First the special tokens are cut out of the text
(:meth:`Tokenizer._partition`); then each remaining text fragment goes to the
model's encoder: byte-level BPE (``tokenizer_bpe``) or SentencePiece BPE by
scores (``tokenizer_spm``).
"""
from __future__ import annotations

import functools

import codecs
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import regex

from . import tokenizer_bpe, tokenizer_spm, tokenizer_vocab as vocab
from ..errors import TokenizerError
from .tokenizer_vocab import BYTE, CONTROL, NORMAL, SPECIAL, UNKNOWN, USER_DEFINED


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
    def from_file(cls, f: Any) -> Tokenizer:
        """from_metadata of an open GGUF file (its ``metadata`` and ``path``); a TokenizerError
        names the file."""
        try:
            return cls.from_metadata(f.metadata)
        except TokenizerError as err:
            raise TokenizerError(f"{f.path.name}: {err}") from None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF key -> value (arrays as lists), as llama_vocab::load does."""
        model = vocab.get(meta, "tokenizer.ggml.model", str)
        if model not in vocab.DEFAULT_BOS_EOS:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.model {model!r}: only 'gpt2' (byte-level BPE) "
                "and 'llama' (SentencePiece) are supported")
        texts = vocab.token_texts(meta)
        token_to_id = vocab.index(texts)
        attrs = vocab.token_attrs(meta, len(texts))
        ids = vocab.special_ids(meta, model, len(texts))
        eog_ids = vocab.end_of_generation(texts, token_to_id, attrs, ids)

        # SentencePiece puts a space in front by default; BPE never does, but
        # llama.cpp's detokenizer still strips the leading space by this key.
        add_space_prefix = vocab.get(meta, "tokenizer.ggml.add_space_prefix", bool, model == "llama")
        if model == "gpt2":
            pre = tokenizer_bpe.pre_tokenizer(vocab.get(meta, "tokenizer.ggml.pre", str, None))
            ranks = tokenizer_bpe.parse_merges(vocab.get(meta, "tokenizer.ggml.merges", list))
            encoder = tokenizer_bpe.BpeEncoder(token_to_id, ranks, pre)
            add_bos = pre.add_bos
            pieces = [_bpe_piece(text, attr) for text, attr in zip(texts, attrs)]
        else:
            byte_ids = tokenizer_spm.byte_token_ids(token_to_id)
            encoder = tokenizer_spm.SpmEncoder(
                token_to_id, vocab.scores(meta, len(texts)), byte_ids, add_space_prefix)
            add_bos = True
            pieces = [_spm_piece(text, attr) for text, attr in zip(texts, attrs)]
        add_bos = vocab.get(meta, "tokenizer.ggml.add_bos_token", bool, add_bos)
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

    def encode(self, text: str, *, add_bos: bool = False, parse_special: bool = False,
               plain: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token ids of ``text``. Control tokens are recognised in the text only
        with ``parse_special``, and then not where they overlap a ``plain`` span
        ([start, end) offsets: a chat message's own text in its rendering, which
        is then tokenized as the text around it, as llama.cpp would tokenize it
        had it no control token); user-defined tokens always are (as in llama.cpp).
        A lone surrogate goes in as the three bytes that UTF-8 would spell it
        with, which llama.cpp reads back as that code point. ``add_bos`` puts
        BOS in front where the model's file asks for one
        (``tokenizer.ggml.add_bos_token``), as llama.cpp's ``add_special``."""
        ids: list[int] = []
        if add_bos and self.add_bos:
            ids.append(self.bos_id)
        after_special = True
        for fragment in self._partition(text, parse_special, plain):
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

    @functools.cached_property
    def max_piece_bytes(self) -> int:
        """The most bytes one token stands for: a text of n bytes is at least
        n / max_piece_bytes tokens (n + 1 where a space is put in front)."""
        return max(1, max((len(p) for p in self._pieces), default=1))

    def at_least_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)), without encoding it (a 10 MB prompt
        is refused as too long at once, not after a minute of BPE)."""
        n = len(text.encode("utf-8", errors="surrogatepass")) + (1 if self._add_space_prefix else 0)
        return -(-n // self.max_piece_bytes)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for; a control token's are its text."""
        return self._pieces[self._checked(token_id)]

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[self._checked(token_id)] & CONTROL)

    def _piece(self, token_id: int, skip_special: bool) -> bytes:
        token_id = self._checked(token_id)
        if skip_special and self._attrs[token_id] & SPECIAL:
            return b""
        return self._pieces[token_id]

    def _checked(self, token_id: int) -> int:
        if not 0 <= token_id < self.n_vocab:
            raise TokenizerError(f"token id {token_id} is out of range (n_vocab {self.n_vocab})")
        return token_id

    def has_control_text(self, text: str) -> bool:
        """Whether ``text`` spells a control token (parsed only with parse_special)."""
        return any(not self._specials.always(t) for t in self._specials.occurring_in(text, True))

    def _partition(self, text: str, parse_special: bool, plain: Sequence[tuple[int, int]] = ()) -> list[str | int]:
        """``text`` as raw-text fragments and special-token ids, in order.

        llama.cpp's tokenizer_st_partition: special tokens are taken longest
        first, each one cut out of every raw fragment left at its turn. Only
        the tokens that occur in ``text`` are tried, which changes nothing.
        A control token overlapping a ``plain`` span is left as text there."""
        fragments: list = [(0, text)] if text else []
        for token_id in self._specials.occurring_in(text, parse_special):
            needle = self._texts[token_id]
            keep = (lambda a, b: False) if not plain or self._specials.always(token_id) else \
                (lambda a, b: any(x < b and a < y for x, y in plain))
            fragments = [part for fragment in fragments for part in _cut(fragment, needle, token_id, keep)]
        return [f if isinstance(f, int) else f[1] for f in fragments]


class _SpecialTokens:
    """The control, user-defined and unknown tokens, in llama.cpp's matching order
    (longest UTF-8 text first), with a trie to find which ones occur in a text."""

    _END = ""  # trie key marking that a token ends at this node

    def __init__(self, texts: Sequence[str], attrs: Sequence[int]):
        ids = [i for i, attr in enumerate(attrs) if attr & (CONTROL | USER_DEFINED | UNKNOWN)]
        self._order = {token_id: rank for rank, token_id in enumerate(
            sorted(ids, key=lambda i: (-len(_text_bytes(texts[i])), i)))}
        self._parsed_always = frozenset(i for i in ids if not attrs[i] & SPECIAL)
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

    def always(self, token_id: int) -> bool:
        """Whether the token is parsed without parse_special too (user-defined, unknown)."""
        return token_id in self._parsed_always


def _cut(fragment, needle: str, token_id: int, kept: Callable[[int, int], bool]) -> list:
    """``fragment`` (a token id, or (offset, text)) with every occurrence of ``needle``, left
    to right, replaced by ``token_id``, but for those at [a, b) in the whole text where
    ``kept(a, b)``: those stay text."""
    if isinstance(fragment, int):
        return [fragment]
    at, text = fragment
    parts: list = []
    done = start = 0
    while (hit := text.find(needle, start)) >= 0:
        if kept(at + hit, at + hit + len(needle)):
            start = hit + 1
            continue
        if hit > done:
            parts.append((at + done, text[done:hit]))
        parts.append(token_id)
        done = start = hit + len(needle)
    if done < len(text):
        parts.append((at + done, text[done:]))
    return parts


class StreamDecoder:
    """Incremental detokenization: text comes out as soon as its UTF-8 is complete.

    ``after``: the token ids this text continues (a context's). Their text may end
    inside a character (a generation cut there); the decoder starts from those bytes,
    so the token that finishes the character brings all of it."""

    TAIL = 8  # tokens of ``after`` read: an unfinished character is at most 3 bytes

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False, after: Sequence[int] = ()):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if after:  # only the unfinished bytes at the end stay in the decoder's state
            self._utf8.decode(b"".join(tokenizer._piece(t, skip_special) for t in after[-self.TAIL:]))

    def push(self, token_id: int) -> str:
        """The text that became complete with ``token_id`` (may be "")."""
        return self._utf8.decode(self._tokenizer._piece(token_id, self._skip_special))

    def flush(self) -> str:
        """What is held back at the end: an incomplete sequence becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)


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
        return _byte_piece(text)
    return b""  # unused and undefined tokens render as nothing


_BYTE_TOKEN = regex.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_piece(text: str) -> bytes:
    """The byte a BYTE token stands for, which its text spells as ``<0xXX>``."""
    spelled = _BYTE_TOKEN.fullmatch(text)
    if spelled is None:
        raise TokenizerError(f"token {text!r} has type BYTE (6) in tokenizer.ggml.token_type, "
                             "but a byte token must be spelled <0xXX>")
    return bytes([int(spelled[1], 16)])


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
        return _byte_piece(text)
    return b""  # unused and undefined tokens render as nothing
