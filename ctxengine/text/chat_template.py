"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered as HF transformers does.

The environment matches transformers' ``_compile_jinja_template``: an
``ImmutableSandboxedEnvironment`` with trim_blocks and lstrip_blocks, the
loopcontrols extension, a ``{% generation %}`` block (rendered as its body),
``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson`` filter like
``json.dumps`` (no HTML escaping, keys in order, ``ensure_ascii=False``).
Templates are data from a model file, so the sandbox refuses unsafe attribute
access (``''.__class__``...) outright instead of rendering it as empty, and a
render is bounded in steps, time, memory and size (text/template_limits.py);
compiling one, inside ``ctxengine.load``, runs none of its code.

Without a template in the file, ``ChatTemplate.for_model`` falls back by
``general.architecture``: gemma, gemma2 and gemma3 get Gemma's turn format
(``<start_of_turn>user\\n...<end_of_turn>\\n``, assistant as ``model``, a
system message folded into the first user turn as Gemma 3's template does, and
what that template refuses, roles that do not alternate, rendered as llama.cpp's
gemma template renders it);
any other architecture gets None.  The fallback writes no BOS text: the
tokenizer adds BOS (``tokenizer.ggml.add_bos_token``) when a context starts.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable, Mapping

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import SecurityError

from ..errors import CtxError, ModelFileError, RequestError
from .template_limits import LimitedSandbox, TemplateLimit, render_limited

ROLES = ("system", "user", "assistant")

GEMMA_FALLBACK = (
    # Gemma 3's own template (Hugging Face's) wherever it renders a conversation: an opening
    # system message before the first turn's text, then turns whose roles alternate from
    # "user" (any role but "user" in the second place of a pair, a later "system" a turn of
    # its own). Where it refuses one (two user turns in a row, a chat that opens with the
    # model's greeting, a second system message), llama.cpp's gemma template's way: every
    # system message, trimmed, joined to the next turn that is not the model's (dropped
    # if none follows), each other message its own turn. Trimmed as llama.cpp trims (C's
    # isspace: ASCII whitespace only), not as Jinja's trim (str.strip: U+3000, U+00A0, ...).
    "{%- set first = 1 if messages and messages[0]['role'] == 'system' else 0 -%}"
    "{%- set ns = namespace(hf=true, system='') -%}"
    "{%- for message in messages[first:] -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{%- set ns.hf = false -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if ns.hf and loop.first and first -%}"
    "{%- set ns.system = message['content'] + '\n\n' -%}"
    "{%- elif message['role'] == 'system' and not ns.hf -%}"
    "{%- set ns.system = ns.system + (message['content'] | trim_c) -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if ns.system and role != 'model' -%}"
    "{{ ns.system if ns.hf else ns.system + '\n\n' }}{%- set ns.system = '' -%}"
    "{%- endif -%}"
    "{{ (message['content'] | trim) if ns.hf else (message['content'] | trim_c) }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
FALLBACKS = {"gemma": GEMMA_FALLBACK, "gemma2": GEMMA_FALLBACK, "gemma3": GEMMA_FALLBACK}


class _Raised(Exception):
    """What the template's raise_exception() throws: its message goes to the user."""


def _raise_exception(message: Any) -> None:
    raise _Raised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _trim_c(text: Any) -> str:
    """llama.cpp's trim(): the ASCII whitespace C's isspace() knows, at both ends."""
    return str(text).strip(" \t\n\v\f\r")


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text for masks; here it is its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Sandbox(LimitedSandbox):
    def unsafe_undefined(self, obj: Any, attribute: str):
        # The stock sandbox returns an Undefined that prints as "": refuse instead.
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")


def _environment() -> jinja2.Environment:
    # The filters go in through the constructor: LimitedSandbox bounds each, and keeps it from compile time.
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTag],
                   filters={"tojson": _tojson, "trim_c": _trim_c})
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# What a conversation with tool calls adds (rendered by templates that know tools; see text/tools.py).
TOOL_KEYS = frozenset({"tool_calls", "tool_call_id", "name"})


def check_messages(messages: Any, *, tools: bool = False) -> list[dict]:
    """Copies of the messages after checking each is {"role": known, "content": str}
    (``tools``: also role "tool" and the TOOL_KEYS)."""
    if not isinstance(messages, (list, tuple)):
        raise CtxError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise CtxError(f"message {i} must be a dict with 'role' and 'content', got {type(m).__name__}")
        extra = set(m) - {"role", "content"} - (TOOL_KEYS if tools else set())
        if extra:
            raise CtxError(f"message {i} has unsupported key(s): {', '.join(sorted(map(str, extra)))}")
        roles = (*ROLES, "tool") if tools else ROLES
        if m.get("role") not in roles:
            raise CtxError(f"message {i} has role {m.get('role')!r}; expected one of {', '.join(roles)}")
        if not isinstance(m.get("content"), str):
            raise CtxError(f"message {i} content must be a string, got {type(m.get('content')).__name__}")
        out.append({**{k: m[k] for k in TOOL_KEYS & set(m)}, "role": m["role"], "content": m["content"]}
                   if tools else {"role": m["role"], "content": m["content"]})
    return out


# The variables the renderer sets itself (and the globals it defines): a request's template kwargs may not.
# ("self": jinja2's Template.render takes its variables as **kwargs beside its own self.)
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "self",
                                *_environment().globals})


def check_template_kwargs(kwargs: Any, param: str = "template_kwargs") -> dict:
    """A copy of ``kwargs``, extra template variables (chat_template_kwargs on the wire), after
    checking it is a dict of string keys, none in RESERVED_VARIABLES, to JSON values (what
    json.loads could give); a RequestError naming ``param`` and the key at fault otherwise."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise RequestError(f"{param} must be an object (a dict), got {type(kwargs).__name__}", param=param)
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise RequestError(f"{param} keys must be strings, got {type(key).__name__} {key!r}", param=param)
        if key in RESERVED_VARIABLES:
            raise RequestError(f"{param} may not set {key!r}: the chat renderer sets that variable itself "
                               f"(reserved: {', '.join(sorted(RESERVED_VARIABLES))})", param=param)
        bad = _not_json(value)
        if bad is not None:
            raise RequestError(f"{param}[{key!r}] must be a JSON value, and holds a {bad}", param=param)
    return dict(kwargs)


def _not_json(value: Any) -> str | None:
    """The type name of the first thing in ``value`` that json.loads could not give; None if none."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return "dict with a key that is not a string"
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
        elif v is not None and not isinstance(v, (str, bool, int, float)):
            return type(v).__name__
    return None


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        if not isinstance(source, str):
            raise CtxError(f"a chat template must be a string, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise CtxError(f"chat template syntax error at line {e.lineno}: {e.message}") from None
        except RecursionError:  # jinja2's parser and compiler recurse once a nesting level
            raise CtxError("chat template nests too deeply to compile (blocks or brackets within each "
                           "other past Python's recursion limit)") from None

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list | None = None,
               template_kwargs: Mapping[str, Any] | None = None, **extra) -> str:
        """``tools``: definitions in the OpenAI shape, for templates that render them (text/tools.py).
        ``template_kwargs``: more variables for the template (Qwen3's ``enable_thinking``, say),
        checked by check_template_kwargs: none may be one the renderer sets itself."""
        variables = {**check_template_kwargs(template_kwargs),
                     "bos_token": self.bos_token, "eos_token": self.eos_token, **extra,
                     "messages": check_messages(messages, tools=tools is not None),
                     "add_generation_prompt": add_generation_prompt}
        if tools is not None:
            variables["tools"] = tools
        try:
            return render_limited(self._template, variables)
        except TemplateLimit as e:
            raise CtxError(f"chat template stopped: {e} (it is the model file's code; the bounds are in "
                           "text/template_limits.py)") from None
        except _Raised as e:
            raise CtxError(f"chat template refused the messages: {e}") from None
        except SecurityError as e:
            raise CtxError(f"chat template attempted something unsafe: {e}") from None
        except Exception as e:
            # The template is the model file's code: its failures are the user's to see, not our bugs.
            raise CtxError(f"chat template failed: {type(e).__name__}: {e}") from None

    @classmethod
    def for_model(cls, meta: Mapping[str, Any], token_text: Callable[[int], str]) -> "ChatTemplate | None":
        """The file's template, else a built-in one for its architecture (see module doc), else None."""
        source = meta.get("tokenizer.chat_template")
        if source is not None and not isinstance(source, str):
            raise ModelFileError(f"tokenizer.chat_template is a {type(source).__name__}, not a string")
        if source is None:
            source = FALLBACKS.get(meta.get("general.architecture"))
            if source is None:
                return None

        def text_of(key: str) -> str:
            i = meta.get(key)
            if not isinstance(i, int) or isinstance(i, bool):
                return ""
            try:
                return token_text(i)
            except CtxError as err:  # an id past the vocabulary: say which key holds it
                raise ModelFileError(f"{key} is {i}: {err}") from None

        return cls(source, bos_token=text_of("tokenizer.ggml.bos_token_id"),
                   eos_token=text_of("tokenizer.ggml.eos_token_id"))

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars)"
