"""Lex a Go template (text/template/parse lex.go) and read its literals as Go does.

The template becomes a list of text strings and token lists, one per action,
with the trim markers applied: a left one is ``{{-`` followed by a space, a
right one a space followed by ``-}}``; both strip ASCII whitespace
(`` \\t\\r\\n``).  Comments ``{{/* */}}`` are dropped.

Literals follow strconv, as text/template reads them: a quoted string is
``strconv.Unquote`` (its ``\\x`` and octal escapes are bytes, so
``"\\xc3\\xa9"`` is é; ``\\z``, ``\\'``, ``\\0`` and a lone surrogate are
errors), a raw string drops its carriage returns, and a number is an int or
a float64 by the rules of parse.newNumber and exec's idealConstant.  What Go
refuses to parse raises UnsupportedTemplateError with Go's message.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UnsupportedTemplateError

SPACE = " \t\r\n"

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<declare>:=) | (?P<assign>=) | (?P<pipe>\|) | (?P<lparen>\() | (?P<rparen>\)) | (?P<comma>,)
  | (?P<string>"(?:[^"\\\n]|\\[^\n])*")
  | (?P<raw>`[^`]*`)
  | (?P<number>[+-]?(?:0[xXoObB][0-9a-fA-F_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?[\d_]+)?))
  | (?P<variable>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
  | (?P<dot>\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)
_CHAIN = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_OPERANDS = frozenset({"string", "raw", "number", "variable", "field", "dot", "ident"})
KEYWORDS = frozenset({"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"})


def lex_action(src: str, pos: int) -> tuple[list[tuple[str, str]], int, bool]:
    """Tokens of the action starting at pos, the index after its "}}", and whether it trims right.

    Fields written right after a ")" are a "chain" token (fields of the parenthesised
    value); after a space they are a new argument, as Go's lexer tells them apart.  Any
    other operand right after an operand, with no space between, is Go's parse error."""
    tokens: list[tuple[str, str]] = []
    spaced = True  # a space (or the action's start) since the last token
    while True:
        if src.startswith("}}", pos):
            return tokens, pos + 2, False
        m = _TOKEN.match(src, pos)
        if m is None:
            if pos >= len(src):
                raise UnsupportedTemplateError("template: unclosed action")
            raise UnsupportedTemplateError(f"template: unsupported syntax at {src[pos:pos + 20]!r}")
        if m.lastgroup == "space":
            if src.startswith("-}}", m.end()):
                return tokens, m.end() + 3, True
        else:
            if not spaced and _ends_operand(tokens[-1]) and m.lastgroup in _OPERANDS | {"lparen"}:
                raise UnsupportedTemplateError(f"template: unexpected {m.group()!r} in operand")
            tokens.append((m.lastgroup, m.group()))
        spaced = m.lastgroup == "space"
        pos = m.end()
        if m.lastgroup == "rparen" and src.startswith(".", pos):
            chain = _CHAIN.match(src, pos)
            if chain is None:
                raise UnsupportedTemplateError("template: unexpected <.> in operand")
            tokens.append(("chain", chain.group()))
            pos = chain.end()


def _ends_operand(token: tuple[str, str]) -> bool:
    kind, text = token
    return kind in ("rparen", "chain") or (kind in _OPERANDS and not (kind == "ident" and text in KEYWORDS))


def lex(src: str) -> list:
    """The template as a list of text strings and action token lists, trimming applied."""
    items: list = []
    pos, trim_next = 0, False
    while True:
        start = src.find("{{", pos)
        text = src[pos:] if start < 0 else src[pos:start]
        if trim_next:
            text = text.lstrip(SPACE)
        if start < 0:
            items.append(text)
            return items
        inner = start + 2
        if src.startswith("-", inner) and src[inner + 1: inner + 2] in tuple(SPACE):
            text = text.rstrip(SPACE)
            inner += 2
        items.append(text)
        if src.startswith("/*", inner):
            end = src.find("*/", inner + 2)
            if end < 0:
                raise UnsupportedTemplateError("template: unclosed comment")
            after = end + 2
            trim_next = bool(re.match(r"[ \t\r\n]-}}", src[after:after + 4]))
            after += 4 if trim_next else 0
            if not trim_next and not src.startswith("}}", after):
                raise UnsupportedTemplateError("template: comment ends before closing delimiter")
            pos = after if trim_next else after + 2
            continue
        tokens, pos, trim_next = lex_action(src, inner)
        items.append(tokens)


# -- strings ----------------------------------------------------------------------------
_SIMPLE_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_HEX = re.compile(r"[0-9a-fA-F]+")
_OCTAL = re.compile(r"[0-7]{3}")


def _invalid() -> UnsupportedTemplateError:
    return UnsupportedTemplateError("template: invalid syntax")


def unquote(quoted: str) -> str:
    """strconv.Unquote of a double-quoted literal, whose escapes make bytes, not characters."""
    out = bytearray()
    body, i = quoted[1:-1], 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode("utf-8", "surrogatepass")
            i += 1
            continue
        esc = body[i + 1]  # the lexer keeps a backslash from ending the literal
        if esc in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[esc])
            i += 2
        elif esc in _HEX_DIGITS:
            digits = body[i + 2: i + 2 + _HEX_DIGITS[esc]]
            if len(digits) != _HEX_DIGITS[esc] or not _HEX.fullmatch(digits):
                raise _invalid()
            value = int(digits, 16)
            if esc == "x":
                out.append(value)
            elif value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:  # not a valid rune
                raise _invalid()
            else:
                out += chr(value).encode()
            i += 2 + len(digits)
        elif _OCTAL.fullmatch(body[i + 1: i + 4]) and int(body[i + 1: i + 4], 8) <= 255:
            out.append(int(body[i + 1: i + 4], 8))
            i += 4
        else:
            raise _invalid()
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        # Go keeps the bytes; a prompt of ours is text, so we do not render this one
        raise UnsupportedTemplateError("template: a string literal that is not UTF-8") from None


def unquote_raw(quoted: str) -> str:
    """strconv.Unquote of a raw (backquoted) literal: carriage returns are dropped."""
    return quoted[1:-1].replace("\r", "")


# -- numbers ----------------------------------------------------------------------------
@dataclass(frozen=True)
class IntOverflow:
    """A literal only a uint64 holds: Go parses it, and fails when it is evaluated."""
    text: str


_INT = re.compile(r"""[+-]?(?:
    0[xX](?:_?[0-9a-fA-F])+ | 0[oO](?:_?[0-7])+ | 0[bB](?:_?[01])+ | 0(?:_?[0-7])* | [1-9](?:_?\d)*
)""", re.VERBOSE)
_FLOAT = re.compile(r"[+-]?(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?")


def number(text: str) -> int | float | IntOverflow:
    """The value text/template gives a number literal: an int if it reads as an int64, else a
    float64 when it is written as one ('.', 'e'); errors as Go's parser gives them."""
    if _INT.fullmatch(text):
        digits = text.lstrip("+-").replace("_", "")
        base = {"x": 16, "o": 8, "b": 2}.get(digits[1:2].lower(), 8 if digits[:1] == "0" else 10)
        body = digits[2:] if base != 10 and digits[1:2].isalpha() else digits
        value = int(body, base) * (-1 if text.startswith("-") else 1)
        if -2**63 <= value < 2**63:
            return value
        if 0 <= value < 2**64 and text[0] not in "+-":
            return IntOverflow(text)
    if _FLOAT.fullmatch(text):
        if not any(c in text for c in ".eE"):  # ParseFloat reads it, but it is a too-long integer
            raise UnsupportedTemplateError(f"template: integer overflow: {text!r}")
        value = float(text.replace("_", ""))
        if value not in (float("inf"), float("-inf")):
            return value
    raise UnsupportedTemplateError(f"template: illegal number syntax: {text!r}")
