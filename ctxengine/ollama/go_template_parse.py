"""Parse the subset of Go's text/template that Ollama model templates use.

Covered: text with ``{{- `` / `` -}}`` trimming, comments ``{{/* */}}``,
actions printing a pipeline, ``if`` / ``else if`` / ``else with`` / ``else``,
``range`` (with ``$i, $m :=`` or ``$m :=``), ``with``, ``break``,
``continue``, variable declaration (``:=``) and assignment (``=``), pipes
(``a | f``), parenthesised pipelines, fields (``.Content``, ``$.System``,
``$m.Role``), string, raw-string, number, bool and nil literals, and calls
of the functions in ``FUNCTIONS``.  Anything else (``define``, ``template``,
``block``, chained fields on a parenthesised value, character constants,
other functions) raises UnsupportedTemplateError, so a caller can fall back
to the GGUF's own Jinja template.

Go rules kept: a left trim marker is ``{{-`` followed by a space, a right one
a space followed by ``-}}``; both strip ASCII whitespace (`` \\t\\r\\n``).
Variables must be declared before use, and a declaration lasts until the
``{{end}}`` of the control structure it appears in (its pipeline included).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import UnsupportedTemplateError
from .go_template_values import FUNCS

SPACE = " \t\r\n"
# Builtins of text/template we evaluate, plus Ollama's own (template/template.go funcs);
# and/or are the executor's own, as they evaluate their arguments lazily.
FUNCTIONS = frozenset({"and", "or", *FUNCS})
KEYWORDS = frozenset({"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"})


# -- the tree ---------------------------------------------------------------------------
@dataclass
class Field:            # .A.B (on dot)
    idents: tuple[str, ...]


@dataclass
class Variable:         # $x.A.B ($ alone: the data passed to the template)
    name: str
    idents: tuple[str, ...] = ()


@dataclass
class Dot:              # .
    pass


@dataclass
class Literal:          # "s", `s`, 1, 1.5, true, false, nil
    value: Any


@dataclass
class Func:             # a function identifier
    name: str


@dataclass
class Command:
    args: list          # operands: the first may be a Func taking the rest


@dataclass
class Pipe:
    cmds: list[Command]
    decl: list[str] = field(default_factory=list)   # variables declared or assigned
    is_assign: bool = False                          # "=" rather than ":="


@dataclass
class Text:
    text: str


@dataclass
class Action:
    pipe: Pipe


@dataclass
class Branch:           # if / range / with
    kind: str
    pipe: Pipe
    body: list
    else_body: list | None = None


@dataclass
class Break:
    pass


@dataclass
class Continue:
    pass


# -- lexing -----------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<declare>:=) | (?P<assign>=) | (?P<pipe>\|) | (?P<lparen>\() | (?P<rparen>\)) | (?P<comma>,)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<number>[+-]?(?:0[xX][0-9a-fA-F_]+|(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?))
  | (?P<variable>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
  | (?P<dot>\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)


def _unquote(s: str) -> str:
    # Go's escapes are C's (\n \t \" \\ \xNN \uNNNN \NNN); non-ASCII passes through.
    return s[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")


def _lex_action(src: str, pos: int) -> tuple[list[tuple[str, str]], int, bool]:
    """Tokens of the action starting at pos, the index after its "}}", and whether it trims right."""
    tokens: list[tuple[str, str]] = []
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
            tokens.append((m.lastgroup, m.group()))
        pos = m.end()
        if tokens and tokens[-1][0] == "rparen" and src.startswith(".", pos) and not src.startswith(". ", pos):
            raise UnsupportedTemplateError("template: fields of a parenthesised value are not supported")


def _items(src: str) -> list:
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
        tokens, pos, trim_next = _lex_action(src, inner)
        items.append(tokens)


# -- parsing ----------------------------------------------------------------------------
class _Parser:
    def __init__(self, src: str):
        self.items = _items(src)
        self.i = 0
        self.vars: list[str] = ["$"]

    def parse(self) -> list:
        nodes, end = self.list_until(())
        if end is not None:
            raise UnsupportedTemplateError(f"template: unexpected {{{{{end[0][1]}}}}}")
        return nodes

    def list_until(self, stops: tuple[str, ...]) -> tuple[list, list | None]:
        """Nodes up to an action starting with one of `stops` (returned, consumed)."""
        nodes: list = []
        while self.i < len(self.items):
            item = self.items[self.i]
            self.i += 1
            if isinstance(item, str):
                if item:
                    nodes.append(Text(item))
                continue
            if not item:
                raise UnsupportedTemplateError("template: missing value for command")
            kind, word = item[0]
            if kind == "ident" and word in stops:
                return nodes, item
            nodes.append(self.action(item))
        if stops:
            raise UnsupportedTemplateError("template: unexpected EOF (missing {{end}})")
        return nodes, None

    def action(self, tokens: list):
        kind, word = tokens[0]
        if kind == "ident" and word in ("if", "range", "with"):
            return self.control(word, tokens[1:])
        if kind == "ident" and word in ("break", "continue"):
            if len(tokens) > 1:
                raise UnsupportedTemplateError(f"template: unexpected arguments to {word}")
            return Break() if word == "break" else Continue()
        if kind == "ident" and word in KEYWORDS:
            raise UnsupportedTemplateError(f"template: {{{{{word}}}}} is not supported here")
        return Action(self.pipeline(tokens, decl_ok=True))

    def control(self, kind: str, tokens: list) -> Branch:
        mark = len(self.vars)
        pipe = self.pipeline(tokens, decl_ok=True, range_decl=kind == "range")
        if kind == "range" and pipe.is_assign:
            raise UnsupportedTemplateError("template: range with '=' is not supported")
        body, end = self.list_until(("else", "end"))
        else_body = None
        if end[0][1] == "else":
            rest = end[1:]
            if rest and rest[0] in (("ident", "if"), ("ident", "with")):
                else_body = [self.control(rest[0][1], rest[1:])]  # "else if" shares our {{end}}
            else:
                if rest:
                    raise UnsupportedTemplateError("template: unexpected arguments to else")
                else_body, end = self.list_until(("end",))
                if len(end) > 1:
                    raise UnsupportedTemplateError("template: unexpected arguments to end")
        elif len(end) > 1:
            raise UnsupportedTemplateError("template: unexpected arguments to end")
        del self.vars[mark:]
        return Branch(kind, pipe, body, else_body)

    def pipeline(self, tokens: list, *, decl_ok: bool = False, range_decl: bool = False) -> Pipe:
        decl, is_assign = [], False
        if decl_ok:
            decl, is_assign, tokens = self.declaration(tokens, range_decl)
        cmds, args, depth, start = [], [], 0, 0
        pos = 0
        while pos < len(tokens):
            kind, text = tokens[pos]
            if kind == "pipe":
                if not args:
                    raise UnsupportedTemplateError("template: missing command before |")
                cmds.append(Command(args))
                args = []
            elif kind == "lparen":
                depth, start = 1, pos + 1
                while depth and pos + 1 < len(tokens):
                    pos += 1
                    depth += {"lparen": 1, "rparen": -1}.get(tokens[pos][0], 0)
                if depth:
                    raise UnsupportedTemplateError("template: unclosed left paren")
                args.append(self.pipeline(tokens[start:pos]))
            else:
                args.append(self.operand(kind, text))
            pos += 1
        if not args:
            raise UnsupportedTemplateError("template: missing value for command")
        cmds.append(Command(args))
        for c in cmds[1:]:
            if not isinstance(c.args[0], Func):
                raise UnsupportedTemplateError("template: non-function in a pipeline stage")
        return Pipe(cmds, decl, is_assign)

    def declaration(self, tokens: list, range_decl: bool) -> tuple[list[str], bool, list]:
        names, pos = [], 0
        while pos < len(tokens) and tokens[pos][0] == "variable" and "." not in tokens[pos][1]:
            names.append(tokens[pos][1])
            pos += 1
            if pos < len(tokens) and tokens[pos][0] == "comma" and range_decl and len(names) == 1:
                pos += 1
                continue
            break
        if not names or pos >= len(tokens) or tokens[pos][0] not in ("declare", "assign"):
            return [], False, tokens
        is_assign = tokens[pos][0] == "assign"
        for name in names:
            if is_assign and name not in self.vars:
                raise UnsupportedTemplateError(f"template: undefined variable {name!r}")
        body = tokens[pos + 1:]
        if not is_assign:
            self.vars.extend(names)
        return names, is_assign, body

    def operand(self, kind: str, text: str):
        if kind == "field":
            return Field(tuple(text[1:].split(".")))
        if kind == "dot":
            return Dot()
        if kind == "variable":
            name, *idents = text.split(".")
            if name not in self.vars:
                raise UnsupportedTemplateError(f"template: undefined variable {name!r}")
            return Variable(name, tuple(idents))
        if kind in ("string", "raw"):
            return Literal(_unquote(text) if kind == "string" else text[1:-1])
        if kind == "number":
            return Literal(_number(text))
        if kind == "ident":
            if text in ("true", "false"):
                return Literal(text == "true")
            if text == "nil":
                return Literal(None)
            if text in FUNCTIONS:
                return Func(text)
            raise UnsupportedTemplateError(f"template: function {text!r} is not supported")
        raise UnsupportedTemplateError(f"template: unexpected {text!r} in operand")


def _number(text: str) -> int | float:
    clean = text.replace("_", "")
    try:
        return int(clean, 0)
    except ValueError:
        return float(clean)


def parse_go_template(src: str) -> list:
    """The template's node list; UnsupportedTemplateError for what we do not cover."""
    return _Parser(src).parse()
