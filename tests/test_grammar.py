"""Constrained sampling on the real SmolLM2: the output follows the grammar while
it is sampled, and the grammar's state lives in the context (fork, rewind,
snapshot, restore in another process)."""
import json
import subprocess
import sys
import textwrap

import jsonschema
import numpy as np
import pytest

import ctxengine as ce
from ctxengine.text.grammar import Constraint, Grammar, GrammarError, grammar_vocab
from ctxengine.errors import ContextError, CorruptDataError
from ctxengine.store import Store

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "priority": {"enum": ["low", "medium", "high"]},
        "owner": {"type": "object",
                  "properties": {"name": {"type": "string", "maxLength": 16}, "team": {"enum": ["core", "api"]}},
                  "required": ["name", "team"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2},
    },
    "required": ["title", "priority", "owner", "tags"],
    "additionalProperties": False,
}
ASK = "Describe a software bug report as JSON."


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


def chat(model, text: str, name=None):
    ctx = model.context(name)
    ctx.append(model.chat_prompt([{"role": "user", "content": text}]), parse_special=True)
    return ctx


def reply(ctx, n: int, **kw) -> str:
    return "".join(p.text for p in ctx.generate(n, temperature=0.0, **kw))


def test_vocabulary_bytes_are_ours(model):
    vocab = grammar_vocab(model.tokenizer)
    assert vocab.vocab_size == model.tokenizer.n_vocab
    assert sorted(vocab.eos_tokens) == sorted(model.tokenizer.eog_ids)
    ids = model.tokenize("Grüße, {\"a\": [1, 2.5e3]} ✓")
    assert vocab.decode_bytes(ids) == model.detokenize(ids).encode()
    assert vocab.is_special_token(model.tokenizer.eos_id)


@pytest.fixture(scope="module")
def one_go(model) -> str:
    """The greedy reply to ASK under SCHEMA, generated in one go (the reference)."""
    ctx = chat(model, ASK)
    text = reply(ctx, 160, json_schema=SCHEMA)
    assert ctx.finish_reason == "stop"
    assert ctx.tokens[-1] not in model.tokenizer.eog_ids  # stopped by the grammar, not the model
    assert ctx.constraint_state() is None                  # a finished grammar is over
    ctx.delete()
    return text


def test_a_sentencepiece_vocabulary_too(gemma3_meta):
    from ctxengine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(gemma3_meta)  # Gemma 3: 262k SentencePiece tokens, byte fallback
    vocab = grammar_vocab(tok)
    ids = tok.encode("Grüße, {\"a\": [1, 2.5e3]} ✓ 日本\n\n  x")
    assert vocab.vocab_size == tok.n_vocab and vocab.decode_bytes(ids) == tok.decode(ids).encode()
    allowed = Constraint(Grammar.json_object(), tok, 0).mask(np.zeros(tok.n_vocab, np.float32)) > -np.inf
    assert all(tok.token_bytes(int(i)).lstrip().startswith(b"{") for i in np.flatnonzero(allowed))


def test_json_schema_output_is_valid_and_ends_itself(one_go):
    jsonschema.validate(json.loads(one_go), SCHEMA)


def test_sampled_json_is_valid_too(model):
    ctx = chat(model, ASK)
    text = "".join(p.text for p in ctx.generate(160, json_schema=SCHEMA, temperature=1.2, seed=7, top_k=0))
    jsonschema.validate(json.loads(text), SCHEMA)
    ctx.delete()


def test_gbnf_grammar(model):
    ctx = chat(model, "Is the sky blue? Answer yes or no.")
    text = reply(ctx, 20, grammar='root ::= ("yes" | "no") "." " I am " [0-9]+ "% sure"')
    assert text.startswith(("yes. I am ", "no. I am ")) and text.endswith("% sure")
    assert ctx.finish_reason in ("stop", "length")
    ctx.delete()


@pytest.mark.parametrize("kw, needle", [
    (dict(json_schema={"type": "objekt"}), "invalid JSON schema: Invalid type: objekt"),
    (dict(json_schema="{not json"), "the JSON schema is not valid JSON"),
    (dict(grammar='root ::= "a" | missing'), "invalid GBNF grammar"),
    (dict(grammar='root ::= "a" ('), "Expected ')'"),
    (dict(grammar='root ::= x\nx ::= x'), "allows no token"),
    (dict(grammar="root ::= \"a\"", json_schema={}), "not both"),
])
def test_bad_grammars_are_refused_with_the_reason(model, kw, needle):
    ctx = chat(model, "Hi")
    with pytest.raises(GrammarError) as err:
        next(ctx.generate(4, **kw))
    assert needle in str(err.value)
    assert ctx.n_tokens == len(ctx.tokens)  # nothing was generated
    ctx.delete()


def test_cut_short_then_continued_equals_one_go(model, one_go):
    expected = one_go
    ctx = chat(model, ASK)
    n_prompt = ctx.n_tokens
    head = reply(ctx, 9, json_schema=SCHEMA, close_json=False)  # cut where max_tokens falls
    assert ctx.finish_reason == "length"
    assert ctx.constraint_state()["start"] == n_prompt
    branch = ctx.fork()                      # forks the grammar's state
    assert head + reply(ctx, 160) == expected
    assert ctx.finish_reason == "stop"
    assert head + reply(branch, 160) == expected
    for c in (ctx, branch):
        c.delete()


def test_rewind_inside_the_object_keeps_the_grammar(model):
    ctx = chat(model, ASK)
    n_prompt = ctx.n_tokens
    reply(ctx, 20, json_schema=SCHEMA)
    tail = model.detokenize(ctx.tokens[-6:])
    ctx.rewind(6)                            # back into the object: the grammar goes back too
    assert reply(ctx, 6) == tail
    half = ctx.fork(n_tokens=n_prompt + 10)  # a prefix fork inside the object keeps it as well
    assert model.detokenize(half.tokens[n_prompt:]) + reply(half, 10) == model.detokenize(ctx.tokens[n_prompt:])
    ctx.rewind(ctx.n_tokens - n_prompt + 1)  # before the grammar started: it is gone
    assert ctx.constraint_state() is None
    ctx.delete()
    half.delete()


@pytest.mark.parametrize("n", [4.5, True, "2", -1])
def test_a_refused_rewind_keeps_the_grammar(model, n):
    # rewind(4.5) dropped the unfinished grammar, then raised: the next reply ran unconstrained.
    ctx = chat(model, ASK)
    reply(ctx, 9, json_schema=SCHEMA, close_json=False)
    state, tokens = ctx.constraint_state(), ctx.tokens
    with pytest.raises(ContextError, match="cannot rewind"):
        ctx.rewind(n)
    assert ctx.constraint_state() == state and ctx.tokens == tokens
    ctx.delete()


def test_a_fork_between_two_pieces_keeps_the_grammar(model):
    # It went on unconstrained, writing objects into an array of strings.
    ctx = chat(model, ASK)
    pieces = ctx.generate(30, json_schema=SCHEMA, close_json=False, temperature=0)
    for _ in range(6):
        next(pieces)
    branch = ctx.fork()
    tail = "".join(p.text for p in pieces)
    assert branch.constraint_state() is not None
    assert reply(branch, 24, close_json=False) == tail
    ctx.delete()
    branch.delete()


def test_appending_ends_an_unfinished_grammar(model):
    ctx = chat(model, ASK)
    reply(ctx, 5, json_schema=SCHEMA)
    assert ctx.constraint_state() is not None
    ctx.append(" free text")
    assert ctx.constraint_state() is None
    ctx.delete()


def test_snapshot_mid_object_restores_in_another_process(model, smollm2_path, tmp_path, one_go):
    ctx = chat(model, ASK)
    head = reply(ctx, 12, json_schema=SCHEMA, close_json=False)
    store = Store(tmp_path / "store")
    ctx.snapshot(store, ref="mid")
    store.close()
    expected = one_go
    code = textwrap.dedent(f"""
        import ctxengine as ce
        m = ce.load({str(smollm2_path)!r}, threads=2)
        c = m.restore(ce.Store({str(tmp_path / "store")!r}), "mid")
        print("".join(p.text for p in c.generate(160, temperature=0.0)), end="")
        print("\\n" + c.finish_reason, end="")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rest, finish = out.stdout.rsplit("\n", 1)
    assert finish == "stop"
    assert head + rest == expected
    jsonschema.validate(json.loads(head + rest), SCHEMA)
    ctx.delete()


def test_a_snapshot_with_a_broken_grammar_state_is_refused(model, tmp_path):
    from ctxengine.state.snapshots import check_compatible

    ctx = chat(model, ASK)
    reply(ctx, 3, json_schema=SCHEMA)
    store = Store(tmp_path / "store")
    m = store.get_manifest(ctx.snapshot(store))
    m.sampler_state["grammar"]["start"] = len(m.token_ids) + 5
    with pytest.raises(CorruptDataError, match="grammar starts past"):
        check_compatible(m, "x" * 64, model.engine)
    m.sampler_state["grammar"] = {"format": "other"}
    with pytest.raises(CorruptDataError, match="grammar state"):
        check_compatible(m, "x" * 64, model.engine)
    # well formed, but one whose tokens break it, or that does not compile: restored, and then
    # every generation failed (with the grammar parser's state dumped into the message)
    good = ctx.snapshot(store)
    for grammar, says in (({"kind": "gbnf", "source": 'root ::= "zzzzzz"'},
                           "the context's tokens do not match its grammar: Parser Error: token .* doesn't satisfy "
                           "the grammar; byte .* fails parse$"),
                          ({"kind": "gbnf", "source": "root ::= undefined"}, "invalid GBNF grammar")):
        m = store.get_manifest(good)
        m.sampler_state["grammar"]["grammar"] = grammar
        m.sampler_state["grammar"]["start"] = len(m.token_ids) - 2
        with pytest.raises(CorruptDataError, match=says):
            check_compatible(m, "x" * 64, model.engine)
    store.close()
    ctx.delete()


def test_the_mask_forbids_what_the_grammar_forbids(model):
    c = Constraint(Grammar.gbnf('root ::= "ab"'), model.tokenizer, 0)
    logits = np.zeros(model.tokenizer.n_vocab, dtype=np.float32)
    masked = c.mask(logits)
    allowed = np.flatnonzero(masked > -np.inf)
    assert len(allowed) > 0
    assert all(b"ab".startswith(model.tokenizer.token_bytes(int(i))) for i in allowed)
    with pytest.raises(GrammarError, match="does not match the grammar"):
        c.advance(model.tokenize("zz")[0])


def test_cli_json_schema_file(tmp_path):
    from servers import ctx

    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "bad.json").write_text('{"type": "objekt"}')
    env = {"CTX_STORE": str(tmp_path / "store")}
    out = ctx("run", "--json-schema", tmp_path / "s.json", "-n", "160", ASK, home=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), SCHEMA)
    out = ctx("run", "--json-schema", tmp_path / "bad.json", "x", home=tmp_path, env=env)
    assert out.returncode == 1 and out.stderr == "ctx run: error: invalid JSON schema: Invalid type: objekt\n"
