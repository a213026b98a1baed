"""A JSON reply's object keys are each written once (text/json_keys_once.py): the key
state machine against Python's own JSON parser, the mask's fast paths against a scan
of every token, and the real models, which repeated keys before."""
import json
import random

import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.gguf_file import GGUFFile
from ctxengine.text import json_keys_once as keys_once
from ctxengine.text.closing import Closer
from ctxengine.text.grammar import Constraint, Grammar
from ctxengine.text.tokenizer import Tokenizer
from ctxengine.text.tools import Tool, ToolChoice, forced_call_grammar

POOL = ["a", "b", "ab", "key", "é", "\U0001F600", 'q"', "back\\slash", "new\nline", "", "a/b", "\u0001", "x" * 12]
OBJECT = {"type": "object"}
REPEATER = "<start_of_turn>user\nList many key/value counts as JSON, repeat keys if you like.<end_of_turn>\n" \
           "<start_of_turn>model\n"


def spelled(s: str, rng: random.Random) -> str:
    """A JSON string text denoting ``s``, each character spelled plainly or escaped at random."""
    out = []
    for ch in s:
        plain = json.dumps(ch, ensure_ascii=False)[1:-1]
        units = ch.encode("utf-16-be")
        escaped = "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04{rng.choice('xX')}}"
                          for i in range(0, len(units), 2))
        out.append(rng.choice([plain, plain, escaped, "\\/" if ch == "/" else plain]))
    return '"' + "".join(out) + '"'


def random_json(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth < 4 and r < 0.35:
        pairs = [f"{spelled(rng.choice(POOL), rng)}{rng.choice([':', ' : '])}{random_json(rng, depth + 1)}"
                 for _ in range(rng.randrange(6))]
        return "{" + rng.choice([",", ", ", ",\n  "]).join(pairs) + "}"
    if depth < 4 and r < 0.55:
        return "[" + ", ".join(random_json(rng, depth + 1) for _ in range(rng.randrange(4))) + "]"
    return rng.choice(['1', '-2.5e3', 'true', 'null', spelled(rng.choice(POOL + ["{", "[", "}", ","]), rng)])


def repeated_count(text: str) -> int:
    """How many keys Python's parser sees written again in their object."""
    seen = 0

    def pairs(items):
        nonlocal seen
        keys = [k for k, _ in items]
        seen += len(keys) - len(set(keys))
        return dict(items)
    json.loads(text, object_pairs_hook=pairs)
    return seen


def texts(n: int, seed: int = 20261203) -> list[str]:
    rng = random.Random(seed)
    return [random_json(rng) for _ in range(n)]


def test_byte_by_byte_it_sees_the_repeats_a_parser_sees():
    found = 0
    for text in texts(400):
        state, repeats = keys_once.START, 0
        for b in text.encode():
            repeats += keys_once.repeats(state, bytes([b]))
            state = keys_once.after(state, bytes([b]))
        assert repeats == repeated_count(text), text
        assert state[0] == () and state[1] == keys_once.OUTSIDE, text
        found += repeats
    assert found > 100  # the texts do repeat keys, spelled every way


def test_any_chunking_gives_the_same_states_and_repeats():
    rng = random.Random(7)
    for text in texts(300):
        data = text.encode()
        states, hits = [keys_once.START], []
        for b in data:
            hits.append(keys_once.repeats(states[-1], bytes([b])))
            states.append(keys_once.after(states[-1], bytes([b])))
        at = 0
        while at < len(data):
            end = min(len(data), at + rng.randrange(1, 9))
            assert keys_once.repeats(states[at], data[at:end]) == any(hits[at:end]), (text, at, end)
            assert keys_once.after(states[at], data[at:end]) == states[end], (text, at, end)
            at = end


@pytest.mark.parametrize("raw, final, want", [
    (b"plain", False, b"plain"), (b"a\\u00e9", False, "aé".encode()), (b"\\n\\t\\/\\\"\\\\", False, b'\n\t/"\\'),
    (b"\\ud83d\\ude00", False, "\U0001F600".encode()), (b"\\uD83D\\uDE00x", False, "\U0001F600x".encode()),
    (b"a\\", False, None), (b"a\\u00", False, None), (b"\\ud83d", False, None), (b"\\ud83d\\u", False, None),
    (b"\\ud83d\\ud", False, None), (b"\\ud83d", True, b"\xed\xa0\xbd"), (b"\\ud83d\\n", False, b"\xed\xa0\xbd\n"),
    (b"\\ude00", False, b"\xed\xb8\x80"),
])
def test_decoded(raw, final, want):
    assert keys_once.decoded(raw, final=final) == want


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tokenizer(request, smollm2_path, gemma3_path):
    return Tokenizer.from_file(GGUFFile(str(smollm2_path if request.param == "smollm2" else gemma3_path)))


def test_the_mask_is_a_scan_of_every_token(tokenizer):
    """Its fast paths (a lookup inside a key, fewer tokens scanned elsewhere) miss nothing
    and add nothing: at points all through random texts, under random masks."""
    rng = np.random.default_rng(20261203)
    quoted = {i: tokenizer.token_bytes(i) for i in range(tokenizer.n_vocab) if b'"' in tokenizer.token_bytes(i)}
    ids = np.array(list(quoted))
    allowed = np.zeros(tokenizer.n_vocab, bool)  # those without a quote cannot complete a key
    checked = hits = 0
    for text in texts(25, seed=11):
        state = keys_once.START
        for at, b in enumerate(text.encode()):
            allowed[ids] = rng.random(len(ids)) < 0.7
            if at % 3:  # every third point of each text is checked
                state = keys_once.after(state, bytes([b]))
                continue
            want = [i for i, data in quoted.items() if allowed[i] and keys_once.repeats(state, data)]
            assert keys_once.repeating(state, allowed, tokenizer) == want, (text, state)
            state = keys_once.after(state, bytes([b]))
            checked, hits = checked + 1, hits + len(want)
    assert checked > 500 and hits > 50, (checked, hits)


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    m = ce.load(gemma3_path, threads=2)
    yield m
    m.close()


@pytest.mark.parametrize("schema", [OBJECT, {"type": "object", "patternProperties": {"^k": {"type": "integer"}},
                                             "additionalProperties": False}])
def test_gemma_no_longer_repeats_a_key(gemma, schema, monkeypatch):
    """Asked to repeat keys, Gemma 3 wrote {"key": 1, "key": 2, ...} under any-keys schemas;
    the mask makes it name each once, and the reply still parses."""
    def reply(c):
        return "".join(p.text for p in c.generate(max_tokens=100, temperature=0.0, json_schema=schema))
    c = gemma.context()
    c.append(REPEATER)
    branch = c.fork()
    text = reply(c)
    assert c.finish_reason == "stop" and repeated_count(text) == 0, text
    with monkeypatch.context() as patch:  # the same request unmasked: the case is a real one
        patch.setattr(keys_once, "repeating", lambda *a: [])
        assert repeated_count(reply(branch)) > 0


def test_a_cut_reply_replays_its_keys(gemma):
    """A reply cut by max_tokens, then continued on a fork of fewer tokens (its grammar, keys
    and all, replayed over them), ends as the reply in one go."""
    c = gemma.context()
    c.append(REPEATER)
    start = c.n_tokens
    one_go = c.fork()
    whole = "".join(p.text for p in one_go.generate(max_tokens=80, temperature=0.0, json_schema=OBJECT))
    list(c.generate(max_tokens=30, temperature=0.0, json_schema=OBJECT, close_json=False))
    assert c.finish_reason == "length"
    shorter = c.fork(n_tokens=c.n_tokens - 3)
    list(shorter.generate(max_tokens=80 - (shorter.n_tokens - start), temperature=0.0))
    assert gemma.detokenize(shorter.tokens[start:]) == whole and repeated_count(whole) == 0


PATTERN = {"type": "object", "patternProperties": {"^x_[0-9]$": {"type": "integer"}}, "additionalProperties": False}
TWO = {"type": "object", "patternProperties": {"^[a-z]{2}$": {"type": "integer"}}, "additionalProperties": False}


@pytest.mark.parametrize("schema, cut", [(OBJECT, '{"ab": 1, "ab'), (PATTERN, '{"x_0": 1, "'), (PATTERN, '{"x_0": 1, "x_'),
                                         (TWO, '{"aa": 1, "'), (TWO, '{"aa": 1, "a')])
def test_the_closer_does_not_close_a_key_into_a_repeat(tokenizer, schema, cut):
    """A reply cut inside (or before) a key: the completion that closes it within the budget
    writes a key its object does not have, searching past the first bytes its pattern takes
    (it wrote ``"x_0":0`` again after ``{"x_0": 123,``; found by a probe)."""
    ids = tokenizer.encode(cut)
    constraint = Constraint(Grammar.json_schema(schema), tokenizer, 0)
    constraint.feed(ids)
    closer = Closer(constraint, tokenizer, ids)
    plan = closer._completion(constraint.matcher, True, False)
    text = tokenizer.decode(ids + [t for t in plan if t not in tokenizer.eog_ids])
    assert repeated_count(text) == 0 and len(json.loads(text)) == 2, text


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "granite"])
def test_a_forced_calls_keys_are_followed(fmt):
    tool = Tool("f", parameters={"type": "object", "additionalProperties": {"type": "integer"}})
    assert forced_call_grammar([tool], ToolChoice("required"), fmt).json_text


@pytest.mark.parametrize("grammar", [
    Grammar("lark", 'start: "say \\"" call\ncall: %json {"type": "object"}'),  # a quote of its own
    Grammar("lark", 'start: /[{"]*/ call\ncall: %json {"type": "object"}'),  # a regex: anything
    Grammar("lark", 'start: "{" call\ncall: %json {"type": "object"}'),
    Grammar.gbnf('root ::= "{\\"a\\": 1, \\"a\\": 2}"'),
])
def test_a_grammar_whose_own_text_may_hold_json_syntax_is_not_followed(grammar):
    assert not grammar.json_text
