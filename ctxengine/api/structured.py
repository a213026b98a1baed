"""Structured output as each dialect asks for it, onto one engine Grammar.

* OpenAI chat/completions: ``response_format`` ``{"type": "json_object"}`` or
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``;
* OpenAI Responses: ``text.format`` ``{"type": "json_object"}`` or
  ``{"type": "json_schema", "name", "schema", "strict"}``;
* Ollama: ``format`` ``"json"`` or a JSON Schema object;
* every dialect: ``grammar`` (our extension, as llama.cpp's server has it): GBNF text.

The output is constrained while it is sampled (text/grammar.py), so every
reply under a schema is valid against it, except for the few keywords
sampling cannot enforce (``uniqueItems``, ``contains``, ``if``/``then``,
``dependentRequired``...): those are ignored, and ``strict: true`` refuses
them instead.
An unusable schema or grammar is a 400 naming the field and the problem.
"""
from __future__ import annotations

from ..text.grammar import Grammar, GrammarError
from .errors import ApiError
from .fields import Fields


def checked(make, param: str) -> Grammar:
    """``make()``'s Grammar, compiled now so that a bad one is refused before any work."""
    try:
        g = make()
        g.compiled()
    except GrammarError as err:
        raise ApiError(400, f"'{param}': {err}", param=param) from None
    return g


def refuse_unenforced(g: Grammar, param: str) -> None:
    """A strict schema's keywords that sampling cannot enforce are a 400 (without
    strict they are ignored, and the reply keeps every other rule)."""
    keys = g.unenforced()
    if keys:
        raise ApiError(400, f"'{param}': the schema is strict and uses {', '.join(keys)}, which cannot be "
                            "enforced while sampling (without strict they are ignored)", param=param)


def _one(f: Fields, found: Grammar | None, param: str) -> Grammar | None:
    if "grammar" in f:
        if found is not None:
            raise ApiError(400, f"give '{param}' or 'grammar', not both", param="grammar")
        text = f.str("grammar")
        return checked(lambda: Grammar.gbnf(text), "grammar")
    return found


def _schema_format(fmt: Fields, schema_holder: Fields, param: str) -> Grammar | None:
    kind = fmt.str("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return checked(Grammar.json_object, param)
    if kind == "json_schema":
        if "schema" not in schema_holder:
            raise ApiError(400, f"'{schema_holder.where}schema' is required for type json_schema", param=param)
        schema = schema_holder.data["schema"]
        g = checked(lambda: Grammar.json_schema(schema), param)
        if schema_holder.data.get("strict") is True:
            refuse_unenforced(g, param)
        return g
    raise ApiError(400, f"'{fmt.where}type' is '{kind}'; expected text, json_object or json_schema", param=param)


def openai_grammar(f: Fields) -> Grammar | None:
    """``response_format`` (or ``grammar``) of a chat or completions request."""
    fmt = f.obj("response_format")
    return _one(f, _schema_format(fmt, fmt.obj("json_schema"), "response_format"), "response_format")


def responses_grammar(f: Fields) -> Grammar | None:
    """``text.format`` (or ``grammar``) of a Responses request."""
    fmt = f.obj("text").obj("format")
    return _one(f, _schema_format(fmt, fmt, "text.format"), "text.format")


def anthropic_grammar(f: Fields) -> Grammar | None:
    """``output_config.format`` (``{"type": "json_schema", "schema"}``, the current
    Messages API's structured output) or ``grammar`` of a Messages request."""
    fmt = f.obj("output_config").obj("format")
    return _one(f, _schema_format(fmt, fmt, "output_config.format"), "output_config.format")


def ollama_grammar(f: Fields) -> Grammar | None:
    """Ollama's ``format``: "json", a JSON Schema object, or "" (none); or ``grammar``."""
    fmt = f.data.get("format")
    if fmt in (None, ""):
        found = None
    elif fmt == "json":
        found = checked(Grammar.json_object, "format")
    elif isinstance(fmt, dict):
        found = checked(lambda: Grammar.json_schema(fmt), "format")
    else:
        raise ApiError(400, f"'format' must be \"json\" or a JSON schema object, got {fmt!r}"[:200], param="format")
    return _one(f, found, "format")
