"""GPT-2 style byte-level BPE (``tokenizer.ggml.model = "gpt2"``), as llama.cpp runs it.

A text fragment is cut into pre-tokens ("words") by the regexes that
``tokenizer.ggml.pre`` names; each word's UTF-8 bytes are spelled with GPT-2's
printable byte alphabet, and ranked merges then join adjacent symbols, lowest
rank first. Words never merge with each other, so each word's ids are cached.
"""
from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ctxengine.errors import TokenizerError

from . import unicode_classes


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest
    are shifted to U+0100 upwards so that no byte is spelled as whitespace."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = [""] * 256
    shifted = 0
    for b in range(256):
        if b in printable:
            alphabet[b] = chr(b)
        else:
            alphabet[b] = chr(256 + shifted)
            shifted += 1
    return alphabet


BYTE_TO_CHAR: list[str] = _byte_alphabet()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table that turns a latin-1 decoded byte string into the alphabet.
_LATIN1_TO_ALPHABET = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


# The regexes of llama.cpp's llm_tokenizer_bpe, by pre-tokenizer family. They
# run one after the other: each splits the pieces the previous one left, and
# text between matches stays a piece of its own. Their \p{L}, \p{N}, \p{P} and
# \s are llama.cpp's classes (llama_classes), not the `regex` module's, which
# knows letters Unicode has added since llama.cpp's table was made; spelled out,
# they run in the standard library's `re`, whose big sets are bitmaps.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# deepseek-llm spells its letters out instead of using \p{L}.
_DEEPSEEK_LETTERS = (
    "A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115"
    "\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943"
)


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type: its regexes and the flags it implies."""

    patterns: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token is not merged
    add_bos: bool = False  # llama.cpp's add_bos default for this type


_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
_GPT2_TYPE = PreTokenizer((_GPT2,))
_LLAMA3_TYPE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_SMOLLM_TYPE = PreTokenizer((r"\p{N}", _GPT2))
_QWEN2_TYPE = PreTokenizer((_QWEN2,))
_DEEPSEEK_LLM_TYPE = PreTokenizer((
    "[\r\n]",
    rf"\s?[{_DEEPSEEK_LETTERS}]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+\Z",  # std::regex's "$": the end of the piece only, unlike Python's "$"
    _CJK,
    r"\p{N}+",
))
_DEEPSEEK_CODER_TYPE = PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"))
_FALCON_TYPE = PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"))

# tokenizer.ggml.pre value -> type, as llama_vocab::impl::load maps them. The
# types left out either use classes llama.cpp only approximates (its \p{Lu},
# \p{Ll}, ... all mean \p{L}; its \p{S} lacks "~"), or custom splitters
# (kimi-k2, afmoe), or are not BPE over GPT-2 bytes (gemma4, whitespace).
_PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
         "midm-2.0", "lfm2", "jina-v5-nano"],
        _LLAMA3_TYPE,
    ),
    "dbrx": PreTokenizer((_LLAMA3,)),
    "smaug-bpe": PreTokenizer((_LLAMA3,)),
    "deepseek-llm": _DEEPSEEK_LLM_TYPE,
    "deepseek-coder": _DEEPSEEK_CODER_TYPE,
    "falcon": _FALCON_TYPE,
    **dict.fromkeys(
        ["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
         "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe",
         "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"],
        _GPT2_TYPE,
    ),
    **dict.fromkeys(
        ["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
         "minerva-7b", "mellum2"],
        _SMOLLM_TYPE,
    ),
    **dict.fromkeys(
        ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
         "hunyuan", "solar-open"],
        _QWEN2_TYPE,
    ),
}


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer ``tokenizer.ggml.pre`` names; llama.cpp uses "default" when absent."""
    if name is None or name == "":
        return _DEFAULT
    try:
        return _PRE_TOKENIZERS[name]
    except KeyError:
        raise TokenizerError(
            f"unknown or unsupported pre-tokenizer {name!r} (tokenizer.ggml.pre); "
            f"supported: {', '.join(sorted(_PRE_TOKENIZERS))}"
        ) from None


def parse_merges(merges: Sequence[str]) -> dict[tuple[str, str], int]:
    """(left, right) -> rank. Like llama.cpp, split at the first space after the
    first character (so a merge may start with a space) and keep the first rank
    of a pair listed twice."""
    ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(merges):
        if not isinstance(merge, str):
            raise TokenizerError("tokenizer.ggml.merges must be a list of strings")
        cut = merge.find(" ", 1)
        if cut > 0:
            ranks.setdefault((merge[:cut], merge[cut + 1:]), rank)
    return ranks


class BpeEncoder:
    """Encodes text fragments (special tokens already cut out) to token ids."""

    _CACHE_LIMIT = 1 << 16  # words; the cache is dropped whole when full

    def __init__(self, token_to_id: Mapping[str, int], ranks: Mapping[tuple[str, str], int],
                 pre: PreTokenizer):
        self._token_to_id = token_to_id
        self._ranks = ranks
        self._patterns = [re.compile(llama_classes(p)) for p in pre.patterns]
        self._ignore_merges = pre.ignore_merges
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str, after_special: bool) -> list[int]:
        """``after_special`` matters only to SentencePiece; BPE words ignore it."""
        ids: list[int] = []
        for word in self._split(text):
            word_ids = self._cache.get(word)
            if word_ids is None:
                if len(self._cache) >= self._CACHE_LIMIT:
                    self._cache.clear()
                word_ids = self._cache[word] = self._encode_word(word)
            ids.extend(word_ids)
        return ids

    def _rank(self, left: str, right: str) -> int | None:
        return self._ranks.get((left, right))

    def _split(self, text: str) -> list[str]:
        pieces = [text]
        for pattern in self._patterns:
            pieces = [part for piece in pieces for part in _split_keeping_gaps(pattern, piece)]
        return pieces

    def _encode_word(self, word: str) -> list[int]:
        # surrogatepass: a lone surrogate goes through as the 3 bytes llama.cpp would see.
        spelled = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(
            _LATIN1_TO_ALPHABET)
        token = self._token_to_id.get(spelled)
        if self._ignore_merges and token is not None:
            return [token]
        ids: list[int] = []
        for symbol in merge_symbols(list(spelled), self._rank):
            token = self._token_to_id.get(symbol)
            if token is not None:
                ids.append(token)
                continue
            # Not a token (a byte the vocabulary lacks, or a merge result it
            # lacks): llama.cpp looks each UTF-8 byte of the spelled symbol up
            # as a one-character token and drops the bytes that have none.
            for b in symbol.encode("utf-8"):
                byte_token = self._token_to_id.get(chr(b)) if b < 0x80 else None
                if byte_token is not None:
                    ids.append(byte_token)
        return ids


def _class_body(ranges: str) -> str:
    return "".join(rf"\U{int(a, 16):08x}-\U{int(b, 16):08x}" for a, b in (r.split("-") for r in ranges.split()))


_CLASSES = {r"\p{L}": _class_body(unicode_classes.LETTER), r"\p{N}": _class_body(unicode_classes.NUMBER),
            r"\p{P}": _class_body(unicode_classes.PUNCTUATION), r"\s": _class_body(unicode_classes.WHITESPACE)}
_NOT_SPACE = "[^" + _CLASSES[r"\s"] + "]"


def llama_classes(pattern: str) -> str:
    """``pattern`` with each \\p{L}, \\p{N}, \\p{P}, \\s and \\S spelled as llama.cpp's tables
    have them (text/unicode_classes.py): the ranges alone inside a [set], a set outside one."""
    out, in_set, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        name = next((n for n in _CLASSES if pattern.startswith(n, i)), None)
        if name is not None:
            out.append(_CLASSES[name] if in_set else f"[{_CLASSES[name]}]")
            i += len(name)
            continue
        if pattern.startswith(r"\S", i):
            if in_set:
                raise ValueError(rf"\S inside a set cannot be spelled out: {pattern!r}")
            out.append(_NOT_SPACE)
            i += 2
            continue
        if c == "\\":  # an escape: its next character is never a set's bracket
            out.append(pattern[i: i + 2])
            i += 2
            continue
        if c == "[" and not in_set:
            in_set = True
        elif c == "]" and in_set:
            in_set = False
        out.append(c)
        i += 1
    return "".join(out)


def _split_keeping_gaps(pattern: re.Pattern, piece: str) -> list[str]:
    """The matches of ``pattern`` in ``piece`` and the text between them, in order."""
    parts: list[str] = []
    done = 0
    for match in pattern.finditer(piece):
        start, end = match.span()
        if start > done:
            parts.append(piece[done:start])
        if end > start:
            parts.append(piece[start:end])
        done = end
    if done < len(piece):
        parts.append(piece[done:])
    return parts


def merge_symbols(symbols: list[str], priority: Callable[[str, str], float | None]) -> list[str]:
    """Merge adjacent symbols while some pair has a priority: the lowest priority
    first, the leftmost of equal priorities first. This is the loop of both
    llama.cpp's BPE (priority = merge rank) and SentencePiece (priority = minus
    the merged token's score) tokenizers.

    A heap of candidate pairs over a linked list keeps long inputs (a run of
    thousands of spaces is one word) O(n log n). Entries go stale when a side
    was merged away or grew; a side's length only grows, so comparing lengths
    with the length recorded at push time detects that.
    """
    n = len(symbols)
    nxt = [*range(1, n), -1]
    prv = [*range(-1, n - 1)]

    def candidate(left: int, right: int) -> tuple[float, int, int, int] | None:
        if left < 0 or right < 0:
            return None
        rank = priority(symbols[left], symbols[right])
        if rank is None:
            return None
        return rank, left, right, len(symbols[left]) + len(symbols[right])

    heap = [pair for i in range(n - 1) if (pair := candidate(i, i + 1))]
    heapq.heapify(heap)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        a, b = symbols[left], symbols[right]
        if not a or not b or len(a) + len(b) != size:
            continue
        symbols[left], symbols[right] = a + b, ""
        nxt[left] = nxt[right]
        if nxt[left] >= 0:
            prv[nxt[left]] = left
        for pair in (candidate(prv[left], left), candidate(left, nxt[left])):
            if pair:
                heapq.heappush(heap, pair)
    return [s for s in symbols if s]
