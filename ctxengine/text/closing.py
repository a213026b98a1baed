"""Ending a JSON reply inside its token budget.

Bounded schemas (``json_bounds.py``) keep every value finite, but a reply may
still be cut by ``max_tokens`` half way. :class:`Closer` watches the budget
of a generation under a JSON grammar (a JSON Schema, or a forced tool call):
while the tokens left are many more than the reply's shortest completion it
does nothing; near the end it checks, before each sampled token is kept, that
the reply can still be closed in the tokens left after it, and otherwise
emits the completion instead. So a reply parses whenever the shortest valid
one fits in ``max_tokens`` (and the walk below finds a completion).

The completion is found greedily, one byte at a time, on a copy of the
matcher: inside a string it closes the string; elsewhere it prefers what
ends a structure (``}`` ``]``), then the shortest values (``"`` starting an
empty string, ``0``, ``null`` before a ``{`` or ``[`` that may recurse), and
otherwise the first byte the grammar allows (letters first, whitespace
last), until the grammar accepts; in a number that cannot end yet (short of
its minimum, not yet a multiple), the first digit after which it can. A string that cannot end yet is first
offered the schema's examples (text/string_examples.py: each pattern's
shortest match, a canonical value per format), whole or not at all; a free
key it opens gets a name of its own (``a``, ``b``). Inside a string whose
pattern wants a particular byte after free letters (an email's ``@``), a
byte picked again and again makes it look for one that changes what may
follow instead. It is short,
not always shortest, and it costs a few matcher checks a byte, so it is
only computed near the end of the budget, or after a token opens a
structure (which may add required properties to write).
"""
from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Sequence

from . import json_keys_once as keys_once
from .string_examples import schema_examples

if TYPE_CHECKING:
    from .grammar import Constraint, Grammar
    from .tokenizer import Tokenizer

MAX_CLOSING_BYTES = 512
# Start checking when the tokens left are within this many of the last completion's length;
# WIDE times as many for a token that may start something required and long (a key whose
# value is a long constant chosen early left too little room to close).
ZONE = 16
WIDE = 4
_OUTSIDE = b'}]":,01ntf-{['  # null before { and [: a recursive value (a linked list's next) can end
_DIGITS = bytes(range(ord("0"), ord("9") + 1))
_LETTERS = bytes(range(ord("a"), ord("z") + 1)) + _DIGITS
_NUMBER = frozenset(b"0123456789.-+eE")  # a byte after which the walk may be inside a number
_ENDS = b"}],"  # what may follow a finished value
_WHITESPACE = b" \n\r\t"
# Bytes a string's pattern may want after free letters, tried in this order to leave a loop,
# and the bytes whose being allowed tells one state of a string from another.
_WAYS_OUT = b"@.-_:/+TZDHMSWY" + bytes(range(ord("A"), ord("Z") + 1)) + _LETTERS
_PROBES = b'"@.-_:/+ aA0TZDP'
_KEY_BYTES = _LETTERS + b"_-"  # what a key's fresh end is made of, tried in this order
_KEY_SEARCH = 600  # the matcher checks one such search may make


class Closer:
    """Decides, step by step, whether a constrained generation must close now.

    ``next_token(left)`` before a step (``left`` tokens remaining, this one
    included) gives the token to emit instead of sampling, or None; then
    ``keep(token, left)`` says whether a sampled token may stay (False: emit
    ``next_token`` instead); ``consumed(token)`` after any token is kept.
    """

    def __init__(self, constraint: "Constraint", tok: "Tokenizer", consumed: Sequence[int] = ()):
        self._c = constraint
        self._tok = tok
        self._bytes = _byte_tokens(tok)
        self._examples = [e for e in _examples(constraint.grammar) if all(b in self._bytes for b in e)]
        self._plan: list[int] | None = None   # the completion being emitted, once closing
        self._next_plan: list[int] | None = None  # the completion after the sampled token
        # The output so far (the keys in it), and whether it ends inside a JSON string (and
        # just after a backslash).
        self._written = bytearray(b"".join(tok.token_bytes(t) for t in consumed))
        self._in_string, self._escaped = _scan(bytes(self._written), False, False)
        plan = self._completion(constraint.matcher, self._in_string, self._escaped)
        self._need = None if plan is None else len(plan)

    @property
    def need(self) -> int | None:
        """Tokens the last completion found takes (None: none found)."""
        return self._need

    def next_token(self, left: int) -> int | None:
        # Exactly as many tokens left as the completion takes: write it. (With fewer,
        # nothing can make the reply parse, so the model goes on writing it.)
        if self._plan is None and self._need is not None and self._need == left:
            self._plan = self._completion(self._c.matcher, self._in_string, self._escaped)
        if self._plan:
            return self._plan.pop(0)
        return None

    def keep(self, token: int, left: int) -> bool:
        """Whether the sampled token leaves a completion that fits in the ``left - 1`` tokens after it."""
        if self._need is None or left > self._need + ZONE * (WIDE if _may_grow(self._tok.token_bytes(token)) else 1):
            return True
        m = self._c.matcher.deep_copy()
        if token in self._tok.eog_ids or not m.consume_token(int(token)):
            return True  # the grammar's own check (advance) decides
        in_string, escaped = _scan(self._tok.token_bytes(token), self._in_string, self._escaped)
        after = self._completion(m, in_string, escaped, self._tok.token_bytes(token))
        if after is None or len(after) <= left - 1:
            self._next_plan = after
            return True
        now = self._completion(self._c.matcher, self._in_string, self._escaped)
        if not now or len(now) > left:  # it does not fit either way: the model writes on
            self._next_plan = after
            return True
        self._plan = now
        return False

    def consumed(self, token: int) -> None:
        data = self._tok.token_bytes(token)
        self._written += data
        self._in_string, self._escaped = _scan(data, self._in_string, self._escaped)
        if self._next_plan is not None:
            self._need, self._next_plan = len(self._next_plan), None
        elif b"{" in data or b"[" in data:  # a structure opened: it may need more to close
            plan = self._completion(self._c.matcher, self._in_string, self._escaped)
            self._need = None if plan is None else len(plan)

    # -- the completion ------------------------------------------------------
    def _completion(self, matcher, in_string: bool, escaped: bool, pending: bytes = b"") -> list[int] | None:
        """Tokens that complete the grammar from this matcher's state (plus an end of
        generation if more could follow), or None if the greedy walk finds none.
        ``pending``: what the matcher took beyond the output so far (a sampled token)."""
        m = matcher.deep_copy()
        keys = self._c.keys_state
        keys = None if keys is None else keys_once.after(keys, pending)  # the reply's objects' keys
        ids: list[int] = []
        data = bytearray()
        repeats = 0  # the same byte picked again and again inside a string (free letters)
        tried = False  # whether this string was offered the schema's examples
        while not m.is_accepting():
            if len(ids) >= MAX_CLOSING_BYTES:
                return None
            opened = bool(data) and data[-1] == 0x22  # the walk itself opened this string
            in_key = keys is not None and keys[1] == keys_once.KEY and not escaped  # a key: not one its object has
            run = self._string_run(m, pending + data, opened, keys if in_key else None) \
                if in_string and not escaped and not tried else None
            if run is None and in_key and not tried:
                run = self._fresh_key(m, keys)
            tried = tried or in_string
            if run is None:
                last = data[-1:] or pending[-1:] or self._written[-1:]  # the byte before this one
                b = self._pick(m, in_string, escaped, keys, in_number=bool(last) and last[0] in _NUMBER)
                if b is None:
                    return None
                repeats = repeats + 1 if in_string and data and b == data[-1] else 0
                if repeats and repeats & (repeats - 1) == 0:  # at 1, 2, 4, 8... repeats: a way out?
                    b = self._way_out(m, b)
                run = bytes([b])
            for b in run:
                m.consume_token(self._bytes[b])
                ids.append(self._bytes[b])
            data += run
            in_string, escaped = _scan(run, in_string, escaped)
            keys = None if keys is None else keys_once.after(keys, run)
            tried = tried and in_string
        shorter = self._tokenized(matcher, bytes(data))
        plan = shorter if shorter is not None and len(shorter) < len(ids) else ids
        if not m.is_stopped():
            plan.append(self._c.eos)
        return plan

    def _string_run(self, m, data: bytes, opened: bool, keys: "keys_once.State | None" = None) -> bytes | None:
        """What to write first in a string, where closing it at once is not the answer:
        where it cannot end yet, the first of the schema's examples (a pattern's, a
        format's) the grammar takes whole; where the walk opened a free key, a name of its
        own that the reply (``data``: what follows the output so far) has not used as a string yet (``a``,
        ``b``: ``{"":0,"":0}`` is one property, not two, and so was ``{"a": 1, "b":0,"b":0}``
        where the schema did not take "a" as a free key). Inside a key (``keys``: the reply's so
        far), no text that would make it a key its object has."""
        quote = self._bytes.get(0x22)
        if quote is None:
            return None
        if m.validate_tokens([quote]) == 1:
            after = m.deep_copy()
            after.consume_token(quote)
            colon = self._bytes.get(0x3A)
            if not opened or colon is None or after.validate_tokens([colon]) != 1:
                return None  # a string value, or a key the model began: closing it now is shortest
            written = bytes(self._written) + data
            candidates = [name for name in map(_key_name, range(64)) if b'"' + name + b'"' not in written][:8]
        else:
            candidates = self._examples
        for text in candidates:
            if keys is not None and keys_once.repeats(keys, text + b'"'):
                continue
            tokens = [self._bytes[b] for b in text] + [quote]
            if all(b in self._bytes for b in text) and m.validate_tokens(tokens) == len(tokens):
                return text
        return None

    def _fresh_key(self, m, keys: "keys_once.State") -> bytes | None:
        """Inside a key: the shortest end of it, closing quote included, that the grammar takes
        and that is no key its object has, a byte at a time, letters and digits first (a
        pattern's ``x_0`` written already: ``x_1``); None if none within a few bytes."""
        budget = [_KEY_SEARCH]  # matcher checks left
        for limit in range(6):
            found = self._key_end(m, keys, b"", limit, budget)
            if found is not None or budget[0] <= 0:
                return found
        return None

    def _key_end(self, m, keys: "keys_once.State", run: bytes, limit: int, budget: list[int]) -> bytes | None:
        budget[0] -= 1
        if self._allows(m, 0x22) and not keys_once.repeats(keys, run + b'"'):
            return run + b'"'
        for b in _KEY_BYTES if limit else b"":
            budget[0] -= 1
            if budget[0] <= 0:
                return None
            if self._allows(m, b):
                after = m.deep_copy()
                after.consume_token(self._bytes[b])
                found = self._key_end(after, keys, run + bytes([b]), limit - 1, budget)
                if found is not None:
                    return found
        return None

    def _pick(self, m, in_string: bool, escaped: bool, keys: "keys_once.State | None",
              in_number: bool = False) -> int | None:
        """The next byte of the walk (``keys``: the reply's keys so far, where followed: a
        quote that would close a key its object has is no way out of it)."""
        if in_number and not in_string and (digit := self._digit_that_ends(m)) is not None:
            return digit
        order = (b'"' + _LETTERS) if in_string and not escaped else (_LETTERS if escaped else _OUTSIDE + _LETTERS)
        if in_string and not escaped and keys is not None and keys_once.repeats(keys, b'"'):
            order = _LETTERS
        for b in order:
            if self._allows(m, b):
                return b
        allowed = [b for b in range(256) if self._allows(m, b)]
        rest = [b for b in allowed if b not in _WHITESPACE] + [b for b in allowed if b in _WHITESPACE]
        return rest[0] if rest else None

    def _digit_that_ends(self, m) -> int | None:
        """In a number that cannot end yet (short of a minimum, not yet a multipleOf), the
        first digit after which it can: appending 0 every time never reaches a multiple of 7,
        and 0.5 < x wants 0.51, not 0.500001."""
        if any(self._allows(m, e) for e in _ENDS):
            return None
        for d in _DIGITS:
            if self._allows(m, d):
                after = m.deep_copy()
                after.consume_token(self._bytes[d])
                if after.is_accepting() or any(self._allows(after, e) for e in _ENDS):
                    return d
        return None

    def _allows(self, m, b: int) -> bool:
        return b in self._bytes and m.validate_tokens([self._bytes[b]]) == 1

    def _way_out(self, m, b: int) -> int:
        """Inside a string whose pattern wants a particular byte after free letters (the @
        of an email, the D of a duration), picking the first letter again loops forever:
        a byte that changes what may follow, if there is one, else ``b``."""
        now = self._signature(m)
        for other in _WAYS_OUT:
            if other != b and self._allows(m, other):
                after = m.deep_copy()
                after.consume_token(self._bytes[other])
                if self._signature(after) != now:
                    return other
        return b

    def _signature(self, m) -> tuple[bool, ...]:
        return tuple(self._allows(m, c) for c in _PROBES)

    def _tokenized(self, matcher, data: bytes) -> list[int] | None:
        """The completion as the tokenizer would write it, if the grammar takes it so."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        ids = self._tok.encode(text)
        return ids if matcher.validate_tokens(ids) == len(ids) else None


def _key_name(n: int) -> bytes:
    """The walk's n-th free key: a, b, ... z, k26, k27, ..."""
    return bytes([0x61 + n]) if n < 26 else f"k{n}".encode()


@functools.lru_cache(maxsize=64)
def _examples(grammar: "Grammar") -> tuple[bytes, ...]:
    """The schema's pattern and format examples (text/string_examples.py), shortest first."""
    return tuple(e for schema in grammar.schemas() for e in schema_examples(schema))


def _may_grow(data: bytes) -> bool:
    """Whether a token may make the shortest completion longer than a structure's opening
    said: one that starts a key or a value (a quote, a comma, a colon)."""
    return any(b in data for b in b'",:')


def _scan(data: bytes, in_string: bool, escaped: bool) -> tuple[bool, bool]:
    """Whether JSON text continued by ``data`` ends inside a string (and after a backslash)."""
    for b in data:
        if escaped:
            escaped = False
        elif in_string and b == 0x5C:
            escaped = True
        elif b == 0x22:
            in_string = not in_string
    return in_string, escaped


_byte_cache: "weakref.WeakKeyDictionary[Tokenizer, dict[int, int]]" = weakref.WeakKeyDictionary()


def _byte_tokens(tok: "Tokenizer") -> dict[int, int]:
    """byte -> the id of a token that is exactly that byte (control tokens left out)."""
    found = _byte_cache.get(tok)
    if found is None:
        found = {}
        for i in range(tok.n_vocab):
            b = tok.token_bytes(i)
            if len(b) == 1 and not tok.is_control(i):
                found.setdefault(b[0], i)
        _byte_cache[tok] = found
    return found
