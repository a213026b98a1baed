"""Execute a parsed Go template (go_template_parse) on Python data, as text/template does.

Variables live on one stack, as in Go's exec.go: a control structure pops what
was declared inside it at its end, and a range pops its body's variables after
each iteration.  ``and`` and ``or`` evaluate their arguments lazily (Go 1.18+).
An action prints its value unless it declares or assigns a variable.  A
range's else branch runs with the dot outside the range; a ``break`` there
ends that range, a ``continue`` goes on to the enclosing one's next element
(exec.go walkRange recovers only the break).
"""
from __future__ import annotations

from typing import Any

from ..errors import UnsupportedTemplateError
from .go_template_lex import IntOverflow
from .go_template_parse import (Action, Branch, Break, Chain, Command, Continue, Dot, Field, Func, Literal, Pipe,
                                Text, Variable)
from .go_template_builtins import FUNCS, arity_error
from .go_template_values import GoStruct, JSONMap, kind_of, to_text, truth


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


# -- execution --------------------------------------------------------------------------
class Executor:
    def __init__(self, data: Any):
        self.vars: list[list] = [["$", data]]   # [name, value], innermost last
        self.out: list[str] = []

    def run(self, nodes: list) -> str:
        try:
            self.walk(self.vars[0][1], nodes)
        except (_Break, _Continue):  # the parser refuses these; a tree built by hand may not
            raise UnsupportedTemplateError("template: break or continue outside range") from None
        except RecursionError:  # data nested deeper than Python's stack (the parser caps the template's)
            raise UnsupportedTemplateError("template: a value nested too deeply to render") from None
        return "".join(self.out)

    def walk(self, dot: Any, nodes: list) -> None:
        for node in nodes:
            if isinstance(node, Text):
                self.out.append(node.text)
            elif isinstance(node, Action):
                value = self.pipeline(dot, node.pipe)
                if not node.pipe.decl:
                    self.out.append(to_text(value))
            elif isinstance(node, Branch):
                self.branch(dot, node)
            elif isinstance(node, Break):
                raise _Break()
            elif isinstance(node, Continue):
                raise _Continue()

    def branch(self, dot: Any, node: Branch) -> None:
        mark = len(self.vars)
        try:
            value = self.pipeline(dot, node.pipe)
            if node.kind == "range":
                try:
                    self.range(dot, value, node)
                except _Break:  # from its else branch: it ends this range
                    pass
            elif truth(value):
                self.walk(value if node.kind == "with" else dot, node.body)
            elif node.else_body is not None:
                self.walk(dot, node.else_body)
        finally:
            del self.vars[mark:]

    def range(self, dot: Any, value: Any, node: Branch) -> None:
        if isinstance(value, dict):
            pairs = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, (list, tuple)):
            pairs = list(enumerate(value))
        elif value is None:
            pairs = []
        else:
            raise UnsupportedTemplateError(f"template: range can't iterate over {kind_of(value)}")
        if not pairs:
            if node.else_body is not None:
                self.walk(dot, node.else_body)
            return
        inner = len(self.vars)
        for key, elem in pairs:
            if node.pipe.decl:
                self.vars[-1][1] = elem
                if len(node.pipe.decl) > 1:
                    self.vars[-2][1] = key
            try:
                self.walk(elem, node.body)
            except _Continue:
                pass
            except _Break:
                break
            finally:
                del self.vars[inner:]

    def pipeline(self, dot: Any, pipe: Pipe) -> Any:
        value, has_value = None, False
        for cmd in pipe.cmds:
            value = self.command(dot, cmd, (value,) if has_value else ())
            has_value = True
        for name in pipe.decl:
            if pipe.is_assign:
                self.lookup(name)[1] = value
            else:
                self.vars.append([name, value])
        return value

    def command(self, dot: Any, cmd: Command, final: tuple) -> Any:
        head, rest = cmd.args[0], cmd.args[1:]
        if isinstance(head, Literal) and head.value is None:
            raise UnsupportedTemplateError("template: nil is not a command")
        if isinstance(head, Func):
            return self.call(dot, head.name, rest, final)
        if rest or final:
            raise UnsupportedTemplateError("template: can't give argument to non-function")
        return self.arg(dot, head)

    def call(self, dot: Any, name: str, args: list, final: tuple) -> Any:
        if name in ("and", "or"):
            if not args and not final:
                arity_error(name)
            value = None
            for a in args:  # short-circuit, as Go 1.18+ does
                value = self.arg(dot, a)
                if truth(value) != (name == "and"):
                    return value
            return final[0] if final else value
        values = [self.arg(dot, a) for a in args] + list(final)
        try:
            return FUNCS[name](*values)
        except TypeError:
            arity_error(name)

    def arg(self, dot: Any, node: Any) -> Any:
        if isinstance(node, Literal):
            if isinstance(node.value, IntOverflow):
                raise UnsupportedTemplateError(f"template: {node.value.text} overflows int")
            return node.value
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Field):
            return self.fields(dot, node.idents)
        if isinstance(node, Variable):
            return self.fields(self.lookup(node.name)[1], node.idents)
        if isinstance(node, Pipe):
            return self.pipeline(dot, node)
        if isinstance(node, Chain):
            return self.fields(self.pipeline(dot, node.pipe), node.idents)
        if isinstance(node, Func):
            return self.call(dot, node.name, [], ())
        raise UnsupportedTemplateError(f"template: unexpected operand {node!r}")

    def lookup(self, name: str) -> list:
        for pair in reversed(self.vars):
            if pair[0] == name:
                return pair
        raise UnsupportedTemplateError(f"template: undefined variable {name!r}")

    @staticmethod
    def fields(value: Any, idents: tuple[str, ...]) -> Any:
        for ident in idents:
            if isinstance(value, dict):
                value = value.get(ident, value.zero) if isinstance(value, JSONMap) else value.get(ident)
            elif isinstance(value, GoStruct):
                if ident not in value.fields:
                    raise UnsupportedTemplateError(f"template: can't evaluate field {ident}")
                value = value.fields[ident]
            elif value is None:
                raise UnsupportedTemplateError(f"template: nil pointer evaluating .{ident}")
            else:
                raise UnsupportedTemplateError(f"template: can't evaluate field {ident} in type {kind_of(value)}")
        return value


def execute(nodes: list, data: Any) -> str:
    return Executor(data).run(nodes)
