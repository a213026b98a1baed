"""Short strings that a JSON Schema's ``pattern`` or ``format`` takes, for the
closer (``text/closing.py``) to finish a string with when it is cut by the
budget.

The closer walks the grammar a byte at a time and cannot see what a pattern
wants: for ``[0-9]{3}`` (unanchored, as JSON Schema's patterns are), ``hello``
or ``\\.pdf$`` it wrote free letters until its limit and found no way to end
the string. Here each pattern of the schema gives its shortest example, built
from the regex's parse tree (the least repeats, the shortest branch, a plain
character of each class); each ``format`` the grammar knows gives a canonical
value that common parsers take too (a date in year 2000: year 0, which the
walk wrote, is refused by Python's ``datetime``). The closer checks an example
against the grammar before writing it, so a wrong guess costs nothing.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterator

try:
    import re._parser as _sre  # Python 3.11+
    from re import _constants as _c
except ImportError:  # Python 3.10
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre  # type: ignore[no-redef]

FORMATS = {
    "date-time": "2000-01-01T00:00:00Z", "date": "2000-01-01", "time": "00:00:00Z", "duration": "P1D",
    "email": "a@example.com", "idn-email": "a@example.com", "hostname": "example.com",
    "idn-hostname": "example.com", "ipv4": "127.0.0.1", "ipv6": "::1", "uri": "https://example.com",
    "uri-reference": "https://example.com", "iri": "https://example.com", "url": "https://example.com",
    "uuid": "00000000-0000-0000-0000-000000000000",
}
MAX_EXAMPLES = 64
_PLAIN = "a0A_- .@"  # characters an example prefers, in this order, where a class allows several


def schema_examples(schema: Any) -> list[bytes]:
    """The JSON string contents (escaped, without quotes) of an example of each pattern
    and format in the schema, shortest first."""
    found = {json.dumps(e, ensure_ascii=False)[1:-1].encode() for e in _examples(schema)}
    return sorted(found, key=lambda b: (len(b), b))[:MAX_EXAMPLES]


def _examples(s: Any) -> Iterator[str]:
    if isinstance(s, dict):
        if isinstance(s.get("pattern"), str):
            example = pattern_example(s["pattern"])
            if example is not None:
                yield example
        if isinstance(s.get("format"), str) and s["format"] in FORMATS:
            yield FORMATS[s["format"]]
        for v in s.values():
            yield from _examples(v)
    elif isinstance(s, list):
        for v in s:
            yield from _examples(v)


def pattern_example(pattern: str) -> str | None:
    """A short string the regex matches, or None where it cannot tell (look-arounds,
    back-references, a pattern Python's ``re`` does not parse)."""
    try:
        return _sequence(_sre.parse(pattern))
    except (re.error, ValueError, TypeError, OverflowError, RecursionError):
        return None


def _sequence(items) -> str | None:
    out = []
    for op, arg in items:
        piece = _one(op, arg)
        if piece is None:
            return None
        out.append(piece)
    return "".join(out)


def _one(op, arg) -> str | None:
    if op is _c.LITERAL:
        return chr(arg)
    if op is _c.NOT_LITERAL:
        return next(ch for ch in _PLAIN + "b" if ord(ch) != arg)
    if op is _c.ANY:
        return "a"
    if op is _c.IN:
        return _in_class(arg)
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
        low, _, sub = arg
        if low > 64:
            return None
        piece = _sequence(sub)
        return None if piece is None else piece * low
    if op is _c.SUBPATTERN:
        return _sequence(arg[-1])
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return _sequence(arg)
    if op is _c.BRANCH:
        options = [x for x in (_sequence(b) for b in arg[1]) if x is not None]
        return min(options, key=len) if options else None
    if op is _c.AT:
        return ""
    return None  # look-arounds, back-references, conditionals


def _in_class(items) -> str | None:
    negate = bool(items) and items[0][0] is _c.NEGATE
    allowed = [ch for ch in _PLAIN + "bcxyz123BCXYZ!#" if _matches(ch, items[1:] if negate else items) != negate]
    if allowed or negate:
        return allowed[0] if allowed else None
    own = [arg if op is _c.LITERAL else arg[0] for op, arg in items if op in (_c.LITERAL, _c.RANGE)]
    return chr(own[0]) if own else None  # a class of letters none of the plain ones is in (é)


def _matches(ch: str, items) -> bool:
    code = ord(ch)
    for op, arg in items:
        if op is _c.LITERAL and code == arg or op is _c.RANGE and arg[0] <= code <= arg[1]:
            return True
        if op is _c.CATEGORY and re.fullmatch(_CATEGORIES.get(arg, "(?!)"), ch):
            return True
    return False


_CATEGORIES = {_c.CATEGORY_DIGIT: r"\d", _c.CATEGORY_NOT_DIGIT: r"\D", _c.CATEGORY_SPACE: r"\s",
               _c.CATEGORY_NOT_SPACE: r"\S", _c.CATEGORY_WORD: r"\w", _c.CATEGORY_NOT_WORD: r"\W"}
