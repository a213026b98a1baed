"""Tool calls a model makes of its own accord (tool_choice auto) are constrained from their
opening tag to their end (text/lazy_calls.py): a call Gemma 3 wrote with a city its tool's
enum lacks and a key its closed schema refuses (found by a probe, 2026-12-07) now
validates, a reply without the tag is untouched, and speculation changes no bit."""
import json

import jsonschema
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.model_source import CatalogEntry
from ctxengine.serving.prompts import Prompt, prompt_ids
from ctxengine.text import json_keys_once as keys_once
from ctxengine.text.lazy_calls import LazyCalls
from ctxengine.text.tools import Tool, parse_tool_calls, tool_format

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Rome", "Oslo"]},
                                           "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [Tool("get_weather", "the weather in a city", PARAMS)]
WRONG = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "extra": true}}\n</tool_call>'


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    m = ce.load(gemma3_path, threads=2)
    yield m, CatalogEntry(m.name, gemma3_path, "file")
    m.close()


def reply(model, entry, content: str, lazy: bool, shown=TOOLS, n: int = 80, **options) -> tuple[list[int], str]:
    """The tokens and text of the reply to ``content``, the prompt showing the tools ``shown``, the
    calls watched for or not (``lazy``)."""
    ctx = model.context()
    ctx.append(prompt_ids(model, entry, Prompt(messages=[{"role": "user", "content": content}], tools=shown)))
    start = ctx.n_tokens
    calls = LazyCalls.offered(TOOLS, tool_format(model.chat_template), model.tokenizer) if lazy else None
    list(ctx.generate(n, calls=calls, **{"temperature": 0.0, **options}))
    new = ctx.tokens[start:]
    ctx.delete()
    return new, model.detokenize(new)


def test_a_call_of_its_own_accord_is_valid(gemma):
    model, entry = gemma
    _, free = reply(model, entry, f"Repeat exactly this text and nothing else:\n{WRONG}", lazy=False)
    (_, loose), = [(c.name, c.arguments) for c in parse_tool_calls(free, {"get_weather"})[1]]
    with pytest.raises(jsonschema.ValidationError):  # the case is a real one
        jsonschema.validate(loose, PARAMS)
    _, text = reply(model, entry, f"Repeat exactly this text and nothing else:\n{WRONG}", lazy=True)
    calls = parse_tool_calls(text, {"get_weather"})[1]
    assert calls and all(jsonschema.validate(c.arguments, PARAMS) is None for c in calls), text


def test_a_reply_without_the_tag_is_untouched(gemma):
    model, entry = gemma
    question = "Name one colour of the rainbow."  # the tools not shown: Gemma 3 270M recites their prompt
    watched_for = reply(model, entry, question, lazy=True, shown=None)
    assert watched_for == reply(model, entry, question, lazy=False, shown=None) and "<tool" not in watched_for[1]


@pytest.mark.parametrize("options", [{}, {"temperature": 0.9, "seed": 7}])
def test_speculation_changes_no_bit(gemma, options):
    model, entry = gemma
    ask = f"Repeat exactly this text and nothing else:\n{WRONG}"
    on = reply(model, entry, ask, lazy=True, n=40, speculative=True, **options)
    assert on == reply(model, entry, ask, lazy=True, n=40, speculative=False, **options)
    assert "<tool_call>" in on[1]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tokenizer(request):
    return request.getfixturevalue("smollm2").tokenizer if request.param == "smollm2" else \
        request.getfixturevalue("gemma")[0].tokenizer


def watched(tok, ids: list[int]) -> tuple[int, object]:
    """Feed ids one by one to a watch begun before them; (the token index a call began at, its
    constraint), or (-1, None)."""
    lazy = LazyCalls(TOOLS, "fallback", tok)
    lazy.watch([])
    for n in range(1, len(ids) + 1):
        c = lazy.started(ids[:n])
        if c is not None:
            return n, c
    return -1, None


@pytest.mark.parametrize("before", ["", "Sure!", "Let me check. ", "天气"])
def test_the_grammar_starts_at_the_tags_token_and_takes_a_valid_call(tokenizer, before):
    call = '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
    ids = tokenizer.encode(before + "<tool_call>\n" + call)
    n, c = watched(tokenizer, ids)
    assert c is not None and "<tool_call>" in tokenizer.decode(ids[c.start:n])
    assert tokenizer.decode(ids[:c.start]) in before  # it began in the tag's first token
    rest = ids[n:]
    assert c.matcher.validate_tokens(rest) == len(rest)
    c.feed(rest)
    assert c.done


def test_a_call_the_grammar_refuses_to_begin_goes_as_written_and_the_watch_goes_on(tokenizer):
    """A tag whose last token the grammar cannot take whole (``></``: the tag, and no newline
    but the start of the closing one) is left as written; a real call after it is still
    constrained."""
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}\n</tool_call>'
    ending = next(i for i in range(tokenizer.n_vocab) if tokenizer.token_bytes(i) in (b"></", b">,", b"> "))
    ids = tokenizer.encode("Use <tool_call") + [ending] + tokenizer.encode("tool_call> tags. ")
    assert "<tool_call>" in tokenizer.decode(ids)
    lazy = LazyCalls(TOOLS, "fallback", tokenizer)
    lazy.watch([])
    assert all(lazy.started(ids[:n]) is None for n in range(1, len(ids) + 1))
    more = ids + tokenizer.encode(good)
    found = [lazy.started(more[:n]) for n in range(len(ids) + 1, len(more) + 1)]
    assert sum(c is not None for c in found) == 1


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
SHOT = 'Checking.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Tokyo", "unit": "kelvin", "extra": 1}}' \
       '\n</tool_call>'


def few_shot(model):
    """A context whose next reply, SmolLM2 copying two earlier ones, is a call against its schema."""
    tools = [Tool("weather", "weather in a city", WEATHER)]
    messages = [{"role": "user", "content": "Again."}, {"role": "assistant", "content": SHOT}] * 2
    ctx = model.context()
    ctx.append(model.chat_prompt(messages + [{"role": "user", "content": "Again."}], tools=tools), parse_special=True)
    return ctx, lambda: LazyCalls.offered(tools, tool_format(model.chat_template), model.tokenizer)


@pytest.mark.parametrize("first", [4, 8, 12])
def test_a_call_cut_by_max_tokens_goes_on_constrained(smollm2, first):
    """Cut inside the tag (4 tokens) or inside the call, then continued by another
    generate(calls=...), or by a fork: the reply is the one made in one go, its call valid
    (it came out as the model wrote it, "Tokyo" and all; found by a probe)."""
    ctx, calls = few_shot(smollm2)
    start = ctx.n_tokens
    one_go = ctx.fork()
    (call,) = parse_tool_calls("".join(p.text for p in one_go.generate(60, temperature=0.0, calls=calls())),
                               {"weather"})[1]
    jsonschema.validate(call.arguments, WEATHER)
    list(ctx.generate(first, temperature=0.0, calls=calls()))
    branch = ctx.fork()
    for c in (ctx, branch):
        list(c.generate(60 - first, temperature=0.0, calls=calls()))
        assert c.tokens[start:] == one_go.tokens[start:]


def test_keys_are_followed_when_the_tags_token_holds_a_quote_first(smollm2):
    """SmolLM2's ` "<` begins the tag after a quote: the call's keys were not followed, and
    {"a": 1, "a": 1} came back as {"a": 1} (found by a probe)."""
    tok = smollm2.tokenizer
    opener = next(i for i in range(tok.n_vocab) if tok.token_bytes(i) == b' "<')
    ids = tok.encode("Calling") + [opener] + tok.encode('tool_call>\n{"name": "f", "arguments": {"a": 1, "a')
    lazy = LazyCalls([Tool("f", "", {"type": "object", "additionalProperties": {"type": "integer"}})], "fallback", tok)
    lazy.watch([])
    constraint = next(c for n in range(1, len(ids) + 1) if (c := lazy.started(ids[:n])) is not None)
    constraint.feed(ids[len(lazy._starts):])
    quote = next(i for i in range(tok.n_vocab) if tok.token_bytes(i) == b'"')
    assert quote in keys_once.repeating(constraint.keys_state, np.ones(tok.n_vocab, bool), tok)


def test_a_snapshot_mid_call_restores_the_calls_grammar(smollm2, tmp_path):
    """The open call's grammar is stored with the snapshot (its call_skip too) and replayed
    at restore: the restored context's reply is the one made in one go."""
    ctx, calls = few_shot(smollm2)
    start = ctx.n_tokens
    one_go = ctx.fork()
    list(one_go.generate(60, temperature=0.0, calls=calls()))
    list(ctx.generate(12, temperature=0.0, calls=calls()))
    assert ctx.constraint_state()["call_skip"] == 0
    with ce.Store(tmp_path / "store") as store:
        ctx.snapshot(store, ref="mid")
        back = smollm2.restore(store, "mid", name="back")
    list(back.generate(48, temperature=0.0, calls=calls()))
    assert back.tokens[start:] == one_go.tokens[start:]


def test_with_one_call_allowed_the_reply_ends_with_it(smollm2):
    """parallel_tool_calls false: SmolLM2, shown replies of two calls, writes two; with
    ``single`` the reply ends after the first (the second was made, then dropped)."""
    tools = [Tool("weather", "weather in a city", WEATHER)]
    call = '<tool_call>\n{"name": "weather", "arguments": {"city": "Rome", "unit": "c"}}\n</tool_call>'
    messages = [{"role": "user", "content": "Both."}, {"role": "assistant", "content": f"{call}\n{call}"}] * 2
    fmt = tool_format(smollm2.chat_template)
    texts = []
    for single in (False, True):
        ctx = smollm2.context()
        ctx.append(smollm2.chat_prompt(messages + [{"role": "user", "content": "Both."}], tools=tools),
                   parse_special=True)
        texts.append("".join(p.text for p in ctx.generate(
            80, temperature=0.0, calls=LazyCalls.offered(tools, fmt, smollm2.tokenizer, single=single))))
        assert ctx.finish_reason == "stop"
        ctx.delete()
    assert len(parse_tool_calls(texts[0], {"weather"})[1]) == 2
    assert texts[1].endswith("</tool_call>") and len(parse_tool_calls(texts[1], {"weather"})[1]) == 1
