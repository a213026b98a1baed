"""Parse the subset of Go's text/template that Ollama model templates use.

Covered: text with ``{{- `` / `` -}}`` trimming, comments ``{{/* */}}``,
actions printing a pipeline, ``if`` / ``else if`` / ``else with`` / ``else``,
``range`` (with ``$i, $m :=`` or ``$m :=``), ``with``, ``break``,
``continue``, variable declaration (``:=``) and assignment (``=``), pipes
(``a | f``), parenthesised pipelines and fields of their value
(``(index .Messages 0).Role``), fields (``.Content``, ``$.System``,
``$m.Role``), string, raw-string, number, bool and nil literals
(go_template_lex reads them), and calls of the functions in ``FUNCTIONS``.
Anything else (``define``, ``template``, ``block``, character constants,
other functions, nesting deeper than ``MAX_DEPTH``) raises
UnsupportedTemplateError, so a caller can fall back to the GGUF's own Jinja
template.

Go rules kept: variables must be declared before use, and a declaration
lasts until the ``{{end}}`` of the control structure it appears in (its
pipeline included); ``break`` and ``continue`` belong inside a range's body.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UnsupportedTemplateError
from .go_template_lex import KEYWORDS, lex, number, unquote, unquote_raw
from .go_template_builtins import FUNCS

# Builtins of text/template we evaluate, plus Ollama's own (template/template.go funcs);
# and/or are the executor's own, as they evaluate their arguments lazily.
FUNCTIONS = frozenset({"and", "or", *FUNCS})
# Control structures and parentheses nested deeper than this are refused: each level costs
# the parser and the executor a few Python frames, and real templates nest a handful.
MAX_DEPTH = 100


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
class Literal:          # "s", `s`, 1, 1.5, true, false, nil (an IntOverflow fails when evaluated)
    value: Any


@dataclass
class Chain:            # (pipeline).A.B
    pipe: "Pipe"
    idents: tuple[str, ...]


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


# -- parsing ----------------------------------------------------------------------------
class _Parser:
    def __init__(self, src: str):
        self.items = lex(src)
        self.i = 0
        self.vars: list[str] = ["$"]
        self.depth = 0          # control structures and parentheses we are inside
        self.range_depth = 0    # range bodies we are inside, where break and continue belong

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
            if not self.range_depth:
                raise UnsupportedTemplateError(f"template: {{{{{word}}}}} outside {{{{range}}}}")
            return Break() if word == "break" else Continue()
        if kind == "ident" and word in KEYWORDS:
            raise UnsupportedTemplateError(f"template: {{{{{word}}}}} is not supported here")
        return Action(self.pipeline(tokens, decl_ok=True))

    def control(self, kind: str, tokens: list) -> Branch:
        mark = len(self.vars)
        self.enter()
        pipe = self.pipeline(tokens, decl_ok=True, range_decl=kind == "range")
        if kind == "range" and pipe.is_assign:
            raise UnsupportedTemplateError("template: range with '=' is not supported")
        self.range_depth += kind == "range"
        body, end = self.list_until(("else", "end"))
        self.range_depth -= kind == "range"  # a range's else is outside its loop, as in Go
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
        self.depth -= 1
        return Branch(kind, pipe, body, else_body)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise UnsupportedTemplateError(f"template: nested more than {MAX_DEPTH} deep, which we do not render")

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
                self.enter()
                inner = self.pipeline(tokens[start:pos])
                self.depth -= 1
                if pos + 1 < len(tokens) and tokens[pos + 1][0] == "chain":
                    pos += 1
                    inner = Chain(inner, tuple(tokens[pos][1][1:].split(".")))
                args.append(inner)
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
            return Literal(unquote(text) if kind == "string" else unquote_raw(text))
        if kind == "number":
            return Literal(number(text))
        if kind == "ident":
            if text in ("true", "false"):
                return Literal(text == "true")
            if text == "nil":
                return Literal(None)
            if text in FUNCTIONS:
                return Func(text)
            raise UnsupportedTemplateError(f"template: function {text!r} is not supported")
        raise UnsupportedTemplateError(f"template: unexpected {text!r} in operand")


def parse_go_template(src: str) -> list:
    """The template's node list; UnsupportedTemplateError for what we do not cover."""
    return _Parser(src).parse()
