"""Constrained sampling: a grammar (GBNF, Lark, a regex or a JSON Schema) masks
the logits at every step, so the output parses by construction.

The grammar engine is llguidance (the one llama.cpp integrates): a Rust
Earley parser over a token trie that computes the set of allowed next tokens
in ~0.1-0.5 ms for SmolLM2's 49k vocabulary. It is driven by our own
tokenizer's vocabulary (``grammar_vocab``): every token's bytes as
``Tokenizer.token_bytes`` gives them, control tokens marked with a 0xFF
prefix as llguidance's llama.cpp binding marks them, and every end-of-
generation id as an EOS the grammar may allow once it is complete.

A :class:`Grammar` is the user's source (plain data, JSON-serializable); a
:class:`Constraint` is a live matcher for one context. A matcher's state
cannot be serialized, so a snapshot stores what reproduces it: the grammar
and ``start``, the index of the first token consumed under it. Restoring
replays ``tokens[start:]`` through a fresh matcher, which is deterministic.
"""
from __future__ import annotations

import functools
import json
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..errors import CtxError
from .json_bounds import bounded_schema, check_exact, counts_repeated_keys, infinite_ref, uses_keyword
from . import json_keys_once as keys_once
from .grammar_vocab import _llg, grammar_vocab
from .json_keys import lark_variants, schema_variants
from .schema_depth import check_depth

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

STATE_FORMAT = "ctxengine.grammar/1"
KINDS = ("gbnf", "lark", "regex", "json_schema")
# JSON whitespace between tokens: flexible (models write pretty JSON more
# naturally) but bounded, so a small model cannot spend max_tokens on blank lines.
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,24}"
# llguidance's options for every schema: that whitespace, oneOf read as anyOf (it has no
# oneOf; the branches of a real schema's oneOf are disjoint, a null or a tagged variant),
# and keywords it cannot enforce while sampling (uniqueItems, contains, if/then/else,
# dependentRequired...) ignored, not refused: valid schemas (MCP tools use uniqueItems)
# were a 400. The reply then keeps every other rule of the schema; ``unenforced()`` names
# the ignored ones (a strict request refuses them).
JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE, "coerce_one_of": True, "lenient": True}


class GrammarError(CtxError):
    """A grammar or JSON Schema that cannot be compiled (the message names the problem)."""


@dataclass(frozen=True)
class Grammar:
    """A constraint's source: ``kind`` is one of KINDS; a JSON Schema's ``source`` is its JSON text."""

    kind: str
    source: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise GrammarError(f"the {self.kind} grammar is empty")

    @classmethod
    def gbnf(cls, text: str) -> "Grammar":
        return cls("gbnf", text)

    @classmethod
    def json_schema(cls, schema: Mapping | bool | str) -> "Grammar":
        """A JSON Schema (a dict, or its JSON text); True or {} allows any JSON value."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as err:
                raise GrammarError(f"the JSON schema is not valid JSON: {err}") from None
        if schema is True:
            schema = {}
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        # Key order kept: properties are generated in the order the schema lists them.
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's json_object, Ollama's format "json")."""
        return cls.json_schema({"type": "object"})

    @property
    def is_json(self) -> bool:
        """Its sentences are JSON (a schema, or a forced tool call's Lark around one):
        a generation under it is steered to close within its budget (text/closing.py)."""
        return self.kind == "json_schema" or (self.kind == "lark" and "%json" in self.source)

    @functools.cached_property
    def json_text(self) -> bool:
        """Its sentences' every quote, brace and bracket is JSON's (so the reply's object keys
        can be followed, text/json_keys_once.py)."""
        return keys_once.followed(self.kind, self.source)

    def schemas(self) -> list[Any]:
        """The JSON Schemas it holds: a schema's own, or each ``%json`` of a Lark grammar."""
        if self.kind == "json_schema":
            return [json.loads(self.source)]
        found, decoder = [], json.JSONDecoder()
        for m in re.finditer(r"%json\s*", self.source) if self.kind == "lark" else ():
            try:
                found.append(decoder.raw_decode(self.source, m.end())[0])
            except ValueError:
                continue
        return found

    def compiled(self) -> str:
        """The llguidance grammar, checked; GrammarError naming what is wrong."""
        return _compile(self.kind, self.source)[0]

    def unenforced(self) -> list[str]:
        """The JSON Schema keywords its schemas use that sampling cannot enforce (ignored;
        ``oneOf`` is enforced as ``anyOf``: a value may match more than one branch)."""
        keys = list(_compile(self.kind, self.source)[1])
        if any(uses_keyword(schema, "oneOf") for schema in self.schemas()):
            keys.append("oneOf (enforced as anyOf)")
        if any(counts_repeated_keys(bounded_schema(schema)) for schema in self.schemas()):
            keys.append("minProperties (with keys beyond its properties: a key may repeat)")
        return keys

    def to_dict(self) -> dict:
        return {"kind": self.kind, "source": self.source}

    @classmethod
    def from_dict(cls, d: Any) -> "Grammar":
        if not isinstance(d, Mapping) or not isinstance(d.get("kind"), str) or not isinstance(d.get("source"), str):
            raise GrammarError(f"a grammar is {{'kind': str, 'source': str}}, got {d!r}"[:200])
        return cls(d["kind"], d["source"])


def as_grammar(grammar: "Grammar | str | None" = None, json_schema: Mapping | bool | str | None = None) -> Grammar | None:
    """The Python API's two spellings (a Grammar or GBNF text; a JSON Schema) as one Grammar or None."""
    if grammar is not None and json_schema is not None:
        raise GrammarError("give a grammar or a json_schema, not both")
    if isinstance(grammar, str):
        return Grammar.gbnf(grammar)
    if grammar is not None and not isinstance(grammar, Grammar):
        raise GrammarError(f"grammar must be GBNF text or a Grammar, got {type(grammar).__name__}")
    if json_schema is not None:
        return Grammar.json_schema(json_schema)
    return grammar


@functools.lru_cache(maxsize=256)
def _compile(kind: str, source: str) -> tuple[str, tuple[str, ...]]:
    llg = _llg()
    what = {"gbnf": "GBNF grammar", "lark": "Lark grammar", "regex": "regex", "json_schema": "JSON schema"}[kind]
    try:
        schemas = Grammar(kind, source).schemas()
        for schema in schemas:  # before llguidance, which these would crash
            check_depth(schema)  # its stack
        if kind == "json_schema":
            (loaded,) = schemas
            endless = infinite_ref(loaded)
            if endless is not None:
                raise GrammarError(f"invalid JSON schema: no value of it is finite: {endless} always "
                                   f"contains itself again (give it a way to end: optional, or an anyOf)")
            bounded = bounded_schema(loaded)
            check_exact(loaded, bounded)  # numbers it cannot keep (before llguidance too)
            # an object's unlisted keys kept from spelling its listed ones (text/json_keys.py)
            compiled = _first_valid([lambda s=s, x=x: llg.LLMatcher.grammar_from_json_schema(
                json.dumps(s), defaults={**JSON_OPTIONS, **x}) for s, x in schema_variants(bounded)])
        elif kind == "regex":
            compiled = llg.LLMatcher.grammar_from_regex(source)
        elif kind == "lark":
            for schema in schemas:  # a forced call's: numbers it cannot keep
                check_exact(schema)
            compiled = _first_valid([lambda v=v: llg.LLMatcher.grammar_from_lark(v) for v in lark_variants(source)])
        else:
            compiled = llg.grammar_from("gbnf", source)
    except GrammarError:
        raise
    except Exception as err:  # the converters raise ValueError, and plain Exceptions, for bad input
        raise GrammarError(f"invalid {what}: {_one_line(err)}") from None
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(compiled)
    if is_error:
        raise GrammarError(f"invalid {what}: {_one_line(messages[0])}")
    ignored = (re.findall(r'"([^"]+)"', m.partition("Unimplemented keys:")[2]) for m in messages)
    return compiled, tuple(sorted({k for keys in ignored for k in keys}))


def _first_valid(builds: list) -> str:
    """The first of these grammars llguidance compiles and accepts; else the last one (its error
    raised, or found by the caller's check)."""
    for build in builds[:-1]:
        try:
            compiled = build()
        except Exception:  # the next one is the fallback: its error is the one to tell
            continue
        if not _llg().LLMatcher.validate_grammar_with_warnings(compiled)[0]:
            return compiled
    return builds[-1]()


def _one_line(err: object) -> str:
    """The error's text on one line (a regex error's caret line left out; a matcher's dump
    of its parser's state, after "<state>", too)."""
    lines = [line.strip() for line in str(err).partition("<state>")[0].splitlines()]
    text = " ".join(line for line in lines if line and set(line) - {"^", " "})
    return (text or type(err).__name__)[:300]


# -- a live constraint -------------------------------------------------------------
_workers: ThreadPoolExecutor | None = None
_workers_lock = threading.Lock()


def _mask_workers() -> ThreadPoolExecutor:
    """The threads next masks are computed on while forward passes run (llguidance releases the GIL)."""
    global _workers
    with _workers_lock:
        if _workers is None:
            _workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ctx-grammar-mask")
        return _workers


class Constraint:
    """A grammar's matcher for one context: ``mask`` the logits, ``advance`` by the token sampled.

    ``start`` is the index, in the context's tokens, of the first token the
    grammar governs; every token after it has been consumed by the matcher.

    The mask depends only on the tokens consumed, not on the logits, so
    ``prefetch()`` starts computing it on a worker thread before the forward
    pass that makes the logits, and ``mask()`` takes it when they are ready:
    the two overlap instead of running in series. Every other use of the
    matcher waits for a prefetch in flight first (``_settled``).
    """

    def __init__(self, grammar: Grammar, tok: "Tokenizer", start: int, *, call_skip: int | None = None,
                 _matcher=None, _keys: list[keys_once.State] | None = None):
        self.grammar = grammar
        self.start = start
        self._tok = tok
        # A call the model began of its own accord (text/lazy_calls.py): the bytes of its first
        # token before the tag, which are not the call's (None: no such call).
        self.call_skip = call_skip
        # The reply's JSON structure after each token consumed (None: not followed): a key of
        # an object's own choosing is written once (text/json_keys_once.py).
        follow = grammar.json_text or call_skip is not None
        self._keys = _keys if _keys is not None else ([keys_once.START] if follow else None)
        if _matcher is None:
            _matcher = _llg().LLMatcher(grammar_vocab(tok), grammar.compiled(), log_level=0)
        self._matcher = _matcher
        self._words = np.empty((tok.n_vocab + 31) // 32, dtype=np.int32)  # the bitmask, reused
        self._pending: Future | None = None  # the next mask's allowed tokens, being computed
        if self._matcher.is_error():
            raise GrammarError(f"the grammar cannot be used: {_one_line(self._matcher.get_error())}")

    @property
    def matcher(self):
        """The live llguidance matcher (text/closing.py walks copies of it)."""
        return self._settled()

    @property
    def keys_state(self) -> "keys_once.State | None":
        """The reply's JSON structure and its objects' keys so far (None: not followed)."""
        return None if self._keys is None else self._keys[-1]

    @property
    def eos(self) -> int:
        """The end-of-generation id a complete output may end with."""
        tok = self._tok
        return tok.eos_id if tok.eos_id is not None and tok.eos_id in tok.eog_ids else min(tok.eog_ids)

    @property
    def done(self) -> bool:
        """Nothing more can follow: the output is complete."""
        return self._settled().is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is complete (more may still follow)."""
        return self._settled().is_accepting()

    def prefetch(self) -> None:
        """Start computing the next mask on a worker thread (call before the forward pass)."""
        if self._pending is None and not self._matcher.is_stopped():
            self._pending = _mask_workers().submit(self._bias)

    def _bias(self) -> tuple[np.ndarray, bool]:
        """The mask as logit offsets (0: allowed, -inf: forbidden), and whether any token is allowed.
        Offsets, so that what is left for the sampler to wait for is one vector add."""
        self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)  # releases the GIL
        allowed = np.unpackbits(self._words.view(np.uint8), bitorder="little").view(bool)
        if self._keys is not None:
            again = keys_once.repeating(self._keys[-1], allowed, self._tok)
            if again and np.count_nonzero(allowed) > len(again):  # else the grammar's word is last
                allowed[again] = False
        return np.where(allowed, np.float32(0), np.float32(-np.inf)), bool(allowed.any())

    def _settled(self):
        """The matcher, once no prefetch is using it (one in flight is waited for, its mask kept)."""
        if self._pending is not None:
            self._pending.exception()  # waits; an error is raised by mask(), which takes the result
        return self._matcher

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of the logits with every token the grammar forbids at -inf."""
        pending, self._pending = self._pending, None
        bias, some = pending.result() if pending is not None else self._bias()
        m = self._matcher
        if m.is_error() or not some:
            # llguidance's own words past their first line are its parser's state, not the user's
            why = f"; {str(m.get_error()).strip().splitlines()[0][:200]}" if m.is_error() else ""
            raise GrammarError(f"the grammar allows no token here (it cannot be completed{why})")
        return np.asarray(logits, dtype=np.float32) + bias[: len(logits)]  # x + 0 is x, exactly

    def advance(self, token: int) -> None:
        self._drop_pending()
        if token in self._tok.eog_ids and self._matcher.is_accepting():
            return  # the end of the turn: nothing for the grammar to consume
        if not self._matcher.consume_token(int(token)):
            raise GrammarError(f"token {token} ({self._tok.token_bytes(token)!r}) does not match the grammar: "
                               f"{_one_line(self._matcher.get_error())}")
        self._follow([token])

    def feed(self, tokens: Sequence[int]) -> None:
        """Consume tokens already in the context (a restore's replay)."""
        self._drop_pending()
        if tokens and not self._matcher.consume_tokens([int(t) for t in tokens]):
            raise GrammarError(f"the context's tokens do not match its grammar: {_one_line(self._matcher.get_error())}")
        self._follow(tokens)

    def _follow(self, tokens: Sequence[int]) -> None:
        if self._keys is not None:
            for t in tokens:
                data = self._tok.token_bytes(int(t))
                if self.call_skip and len(self._keys) == 1:  # the text the call's tag followed
                    data = data[self.call_skip:]
                self._keys.append(keys_once.after(self._keys[-1], data))

    def fork(self) -> "Constraint":
        return Constraint(self.grammar, self._tok, self.start, call_skip=self.call_skip,
                          _matcher=self._settled().deep_copy(), _keys=None if self._keys is None else list(self._keys))

    def rollback(self, n: int) -> None:
        self._drop_pending()
        if n and not self._matcher.rollback(n):
            raise GrammarError(f"cannot roll the grammar back by {n} tokens")
        if n and self._keys is not None:
            del self._keys[-n:]

    def _drop_pending(self) -> None:
        """Before the matcher's state changes: a mask computed for the old state is of no use."""
        self._settled()
        self._pending = None

    def state(self) -> dict:
        call = {} if self.call_skip is None else {"call_skip": self.call_skip}
        return {"format": STATE_FORMAT, "grammar": self.grammar.to_dict(), "start": self.start, **call}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], tok: "Tokenizer", tokens: Sequence[int]) -> "Constraint":
        """The constraint a snapshot recorded, with ``tokens[start:]`` replayed."""
        start = check_state(state)
        c = cls(Grammar.from_dict(state["grammar"]), tok, start, call_skip=state.get("call_skip"))
        c.feed(tokens[start:])
        return c


def check_state(state: Any) -> int:
    """Refuse a malformed stored constraint state; its ``start``."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise GrammarError(f"not a grammar state of format {STATE_FORMAT!r} (got {got!r})")
    start = state.get("start")
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise GrammarError(f"grammar state start must be an integer >= 0, got {start!r}")
    skip = state.get("call_skip")
    if skip is not None and (not isinstance(skip, int) or isinstance(skip, bool) or skip < 0):
        raise GrammarError(f"grammar state call_skip must be an integer >= 0, got {skip!r}"[:200])
    Grammar.from_dict(state.get("grammar"))
    return start
