"""Each key of a JSON reply's object written once.

llguidance writes a key the schema lists once, but a key of the object's own
choosing (``{"type": "object"}``, OpenAI's ``json_object``, Ollama's
``format: "json"``, ``additionalProperties``, ``patternProperties``) may be
any string, and nothing stopped a model writing one twice: Gemma 3 wrote
``{"key": 1, "key": 2}``, which a parser reads as ``{"key": 2}``, the first
value lost (RFC 8259 asks that names be unique without requiring it). The
grammar cannot see the keys already written; this module does.

A :data:`State` follows a reply's JSON structure byte by byte: the open
objects and arrays, each object's keys so far (what they denote, as UTF-8:
``"\\u0061"`` is ``a``), and whether it is inside a string, a key or a value.
States are immutable, so a fork shares them and a rollback is a shorter list.
:func:`repeating` gives the tokens, among those the grammar allows, that
would complete a key its object already has; ``Constraint`` masks them too.
It reads only the tokens consumed and draws no random number, so the mask is
the same however it is reached (speculation, a replay, a fork).

Only the few tokens holding a quote can complete a key (163 of SmolLM2's
49,152, 834 of Gemma 3's 262,144), and most steps need far fewer of them
scanned: outside a string only those with two quotes (``"a"``), inside a
value three, and inside a key one lookup per key of its object (the bytes
before a token's first quote that would complete it), plus a scan of those
whose quote follows a backslash.
"""
from __future__ import annotations

import json
import re
import weakref
from typing import TYPE_CHECKING, Iterable, Optional

import numpy as np

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

# A state: (open structures, string, escaped, the key's raw bytes so far). A structure is
# (keys, expecting a key) for an object, keys a frozenset of bytes; (None, False) an array.
Frame = tuple[Optional[frozenset], bool]
State = tuple[tuple[Frame, ...], int, bool, bytes]
OUTSIDE, VALUE, KEY = 0, 1, 2  # where a state is: not in a string, in a value's, in a key's
START: State = ((), OUTSIDE, False, b"")
_QUOTE, _BACKSLASH = 0x22, 0x5C
_SIMPLE = {ord(k): v for k, v in {'"': b'"', "\\": b"\\", "/": b"/", "b": b"\b", "f": b"\f",
                                   "n": b"\n", "r": b"\r", "t": b"\t"}.items()}
_HEX = frozenset(b"0123456789abcdefABCDEF")
_LARK_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def followed(kind: str, source: str) -> bool:
    """Whether a grammar's sentences' every quote, brace and bracket is JSON's: a schema's, or
    a Lark grammar's around ``%json`` whose own literals hold none but brackets (a forced
    call's: ``<tool_call>``, ``[``), so that its reply's keys can be followed."""
    if kind != "lark" or "%json" not in source:
        return kind == "json_schema"
    rest, decoder, pos = [], json.JSONDecoder(), 0
    for m in re.finditer(r"%json\s*", source):
        rest.append(source[pos:m.start()])
        try:
            pos = decoder.raw_decode(source, m.end())[1]
        except ValueError:
            return False
        rest.append(" ")
    rest.append(source[pos:])
    text = "".join(rest)
    literals = [lit.replace("\\n", "") for lit in _LARK_LITERAL.findall(text)]
    return not any(c in lit for lit in literals for c in '"{}\\') \
        and not any(c in _LARK_LITERAL.sub("", text) for c in "/'")


def after(state: State, data: bytes) -> State:
    """The state after ``data`` (a repeated key, which the mask lets through only where the
    grammar allows nothing else, is kept once)."""
    return _run(state, data, False)  # type: ignore[return-value]  # never None unchecked


def repeats(state: State, data: bytes) -> bool:
    """Whether ``data`` would complete a key its object already has."""
    return _run(state, data, True) is None


def _run(state: State, data: bytes, check: bool) -> State | None:
    """The state after ``data``; None where ``check`` and it completes a repeated key."""
    stack, string, escaped, raw = state
    begun = 0  # where the key's bytes in data begin
    for i, b in enumerate(data):
        if string:
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped = True
            elif b == _QUOTE:
                if string == KEY:
                    keys = stack[-1][0]
                    key = decoded(raw + data[begun:i], final=True)
                    if key in keys and check:
                        return None
                    stack = stack[:-1] + ((keys | {key}, False),)
                    raw = b""
                string = OUTSIDE
            continue
        if b == _QUOTE:
            top = stack[-1] if stack else (None, False)
            string = KEY if top[0] is not None and top[1] else VALUE
            begun = i + 1
        elif b == 0x7B:  # {
            stack += ((frozenset(), True),)
        elif b == 0x5B:  # [
            stack += ((None, False),)
        elif b in (0x7D, 0x5D):  # } ]
            stack = stack[:-1]
        elif b in (0x3A, 0x2C) and stack and stack[-1][0] is not None:  # : ,
            stack = stack[:-1] + ((stack[-1][0], b == 0x2C),)
    if string == KEY:
        raw += data[begun:]
    return stack, string, escaped, raw


def decoded(raw: bytes, final: bool = False) -> bytes | None:
    """What a JSON string's raw bytes denote, as UTF-8 (lone surrogates kept as such);
    None where they end inside an escape, or between a surrogate pair's halves (unless
    ``final``: the string ends there)."""
    if b"\\" not in raw:
        return raw
    out, i, n = bytearray(), 0, len(raw)
    while i < n:
        j = raw.find(b"\\", i)
        if j < 0:
            out += raw[i:]
            break
        out += raw[i:j]
        if j + 1 == n:
            return None
        if raw[j + 1] != 0x75:  # \u
            out += _SIMPLE.get(raw[j + 1], raw[j + 1:j + 2])
            i = j + 2
            continue
        unit = _unit(raw, j, final)
        if unit is None:
            return None
        code, i = unit
        out += chr(code).encode("utf-8", "surrogatepass")
    return bytes(out)


def _unit(raw: bytes, j: int, final: bool) -> tuple[int, int] | None:
    """The code point of the \\u escape at ``j`` (a surrogate pair's two read as one), and
    where it ends; None where the bytes end first."""
    digits = raw[j + 2:j + 6]
    if len(digits) < 4:
        return None if not final else (0xFFFD, len(raw))
    if not all(c in _HEX for c in digits):
        return 0xFFFD, j + 6  # not JSON: the grammar allows no such escape
    code, end = int(digits, 16), j + 6
    if 0xD800 <= code < 0xDC00:
        low = raw[end:end + 6]
        if not final and len(low) < 6 and b"\\u".startswith(low[:2]) and all(c in _HEX for c in low[2:]):
            return None  # its low half may follow
        if len(low) == 6 and low[:2] == b"\\u" and all(c in _HEX for c in low[2:]):
            second = int(low[2:], 16)
            if 0xDC00 <= second < 0xE000:
                return 0x10000 + ((code - 0xD800) << 10) + second - 0xDC00, end + 6
    return code, end


# -- the mask ---------------------------------------------------------------------
class _QuoteTokens:
    """A vocabulary's tokens holding a quote, sorted by what a step must check of them."""

    def __init__(self, tok: "Tokenizer"):
        self.data: dict[int, bytes] = {}
        for i in range(tok.n_vocab):
            b = tok.token_bytes(i)
            if b'"' in b:
                self.data[i] = b
        self.all = list(self.data)
        self.two = [i for i in self.all if self.data[i].count(b'"') >= 2]  # may open and close a key
        self.three = [i for i in self.two if self.data[i].count(b'"') >= 3]  # ... after closing a string
        self.four = [i for i in self.three if self.data[i].count(b'"') >= 4]  # ... twice, in a new object
        # Inside a key: the bytes before the quote that would close it, where no backslash
        # comes first (else the token is scanned).
        self.closing: dict[bytes, list[int]] = {}
        self.awkward: list[int] = []
        for i, b in self.data.items():
            before = b[:b.index(b'"')]
            if b"\\" in before:
                self.awkward.append(i)
            else:
                self.closing.setdefault(before, []).append(i)


_indexes: "weakref.WeakKeyDictionary[Tokenizer, _QuoteTokens]" = weakref.WeakKeyDictionary()


def _index(tok: "Tokenizer") -> _QuoteTokens:
    found = _indexes.get(tok)
    if found is None:
        found = _indexes[tok] = _QuoteTokens(tok)
    return found


def repeating(state: State, allowed: np.ndarray, tok: "Tokenizer") -> list[int]:
    """The tokens ``allowed`` (a bool per token id) would let complete a key its object has."""
    q = _index(tok)
    stack, string, escaped, raw = state
    found: Iterable[int] = ()
    if not any(keys for keys, _ in stack):
        # No object has a key yet: only a token completing two could repeat one (closing
        # this key then writing it again takes 3 quotes, two keys from outside a string 4).
        scan = q.three if string == KEY else q.four
    elif string == KEY and not escaped and (typed := decoded(raw)) is not None:
        keys = stack[-1][0]
        found = [i for k in keys if k.startswith(typed) for i in q.closing.get(k[len(typed):], ())]
        scan = q.awkward + q.three
    elif string == KEY:
        scan = q.all  # inside an escape: where the first quote falls depends on it
    else:
        scan = q.three if string == VALUE else q.two
    hits = {i for i in found if allowed[i]}
    hits.update(i for i in scan if allowed[i] and i not in hits and repeats(state, q.data[i]))
    return sorted(hits)
