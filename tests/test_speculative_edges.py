"""Speculation at its edges, each once broken: a generation paused and its context
rewound (the lookup index held positions past the cut), a model drafting for
itself in a pool plain decoding fits (it held a second copy of the context), and
a JSON reply whose closer forces its last tokens (settle kept KV for forced
tokens that matched drafts, which plain decoding does not compute), drafts in a
nearly full pool (their pages failed the reply, or evicted an idle context),
and a second generator on one context (closing the first dropped its drafts)."""
import gc
import json

import pytest

import ctxengine as ce
from ctxengine.engine.engine import Engine
from ctxengine.engine.speculative import LookupDrafter
from ctxengine.state.model import Model, attach_draft
from test_speculative import EDIT, chat, free_rows

REPEAT = "Repeat this line ten times: the cat sat on the mat. " + "the cat sat on the mat. " * 10


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


def test_lookup_index_follows_a_list_cut_back_and_grown_again():
    toks = list(range(1, 13))
    d = LookupDrafter(toks)
    assert d.propose(toks, 4) == []
    del toks[-3:]         # a rewind ...
    toks.append(10)       # ... and the same token generated again: indexed positions past the cut were stale
    assert d.propose(toks, 4) == []
    toks += [11, 12, 1, 2]
    assert d.propose(toks, 3) == [3, 4, 5]
    del toks[-4:]
    toks += [7, 7, 2]     # cut back and grown to a longer list with other tokens
    assert d.propose(toks, 3) == [3, 4, 5]


@pytest.mark.parametrize("pause,cut", [(2, 1), (3, 3), (9, 2), (17, 3)])
def test_rewound_mid_generation_continues_as_plain_decoding(model, monkeypatch, pause, cut):
    free_rows(monkeypatch, model)
    outs = []
    for speculative in (False, True):
        c = model.context(f"rewound-{speculative}")
        c.append(chat(model, REPEAT), parse_special=True)
        g = c.generate(40, speculative=speculative, temperature=0.0)
        head = [next(g).token_id for _ in range(pause)]
        c.rewind(cut)
        outs.append((head, [p.token_id for p in g], c.tokens, c.n_cached))
        c.delete()
    assert outs[0] == outs[1]


def test_a_model_drafting_for_itself_fits_where_plain_decoding_fits(smollm2_path, model, monkeypatch):
    ids = model.tokenize(REPEAT * 6, add_bos=True)[:200]  # 13 pages of 16, and 40 more tokens: 16 of the pool's 20
    pages = Engine(smollm2_path, threads=1, kv_budget=20 * model.engine.pool.page_bytes)
    attach_draft(pages, smollm2_path)  # as load(path, draft=path)
    small = Model(pages)
    free_rows(monkeypatch, small)
    try:
        outs = []
        for speculative in (False, True):
            c = small.context(f"self-{speculative}")
            c.append(ids)
            outs.append([p.token_id for p in c.generate(40, speculative=speculative, temperature=0.0)])
            stats = c.speculation
            c.delete()
            gc.collect()
            assert pages.pool.n_used == 0
        assert outs[0] == outs[1] and len(outs[0]) == 40
        assert stats.drafted > 0 and stats.accepted == stats.drafted  # the same model, the same KV: every draft right
    finally:
        small.close()


def test_drafts_never_take_pages_plain_decoding_would_not(smollm2_path, model, monkeypatch, tmp_path):
    # Nearly full pool: a reply that copies the prompt's end is drafted past its own end of
    # turn. Plain decoding fits; the drafts once asked for pages it never needs and the reply
    # failed ("page pool is full"), or (with a store) evicted an idle context. Now they go
    # only onto pages free at the time, else the draft is cut to plain decoding's pages.
    prompt = model.tokenize(chat(model, "Repeat exactly: the cat sat on the mat."), parse_special=True)
    outs = []
    for speculative in (False, True):
        for store in (None, ce.Store(tmp_path / f"store-{speculative}")):
            small = Model(Engine(smollm2_path, threads=1, kv_budget=16 * model.engine.pool.page_bytes))
            small.contexts.store = store
            free_rows(monkeypatch, small)
            try:
                idle = small.context("idle")
                idle.append([200 + i for i in range(240 - 16 * -(-len(prompt) // 16))])
                c = small.context("c")
                c.append(prompt)
                toks = [p.token_id for p in c.generate(40, speculative=speculative, temperature=0.0)]
                outs.append((toks, c.finish_reason, c.n_cached, idle.residency.name))
                if speculative:
                    assert c.speculation.drafted > 0
            finally:
                small.close()
    assert outs[0] == outs[1] == outs[2] == outs[3] and outs[0][1] == "stop" and outs[0][3] == "LIVE"


def test_a_second_generation_on_a_context_keeps_its_drafts_settled(model, monkeypatch, tmp_path):
    # One thread, two generators on one context: closing the first once dropped the second's
    # speculation, whose drafts then stayed in the KV (a snapshot refused n_tokens > tokens).
    free_rows(monkeypatch, model)
    store = ce.Store(tmp_path / "store")
    outs = []
    for speculative in (False, True):
        c = model.context(f"twice-{speculative}")
        c.append(chat(model, REPEAT), parse_special=True)
        first = c.generate(40, speculative=speculative, temperature=0.0)
        head = [next(first).token_id for _ in range(5)]
        second = c.generate(40, speculative=speculative, temperature=0.0, seed=1)
        head += [next(second).token_id for _ in range(7)]
        first.close()
        c.snapshot(store, ref=f"twice-{speculative}")
        assert c.n_cached <= c.n_tokens
        outs.append((head, [p.token_id for p in second], c.tokens, c.n_cached))
        c.delete()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("n", [20, 48])
def test_a_closed_json_reply_leaves_the_kv_plain_decoding_leaves(model, monkeypatch, n):
    free_rows(monkeypatch, model)
    schema = {"type": "object", "required": ["name", "version", "authors"], "properties": {
        "name": {"type": "string"}, "version": {"type": "string"},
        "authors": {"type": "array", "items": {"type": "object", "required": ["name", "email"], "properties": {
            "name": {"type": "string"}, "email": {"type": "string"}}}}}}
    prompt = chat(model, EDIT + " Answer with the name, new version and authors as JSON.")
    outs = []
    for speculative in (False, True):
        c = model.context(f"json-{speculative}")
        c.append(prompt, parse_special=True)
        toks = [p.token_id for p in c.generate(n, json_schema=schema, temperature=0.0, speculative=speculative)]
        seq = c._seq
        outs.append((toks, c.n_tokens, c.n_cached, c.finish_reason,
                     [seq.export_page(i) for i in range(len(seq.pages))]))
        c.delete()
    assert outs[0] == outs[1]
    json.loads(model.detokenize(outs[0][0]))  # closed: it parses


class ThirdRight:
    """Drafts of up to 15 tokens whose first third is the true continuation."""

    def __init__(self, n0, reply):
        self.n0, self.reply = n0, reply

    def propose(self, tokens, k):
        at = len(tokens) - self.n0
        draft = list(self.reply[at:at + min(k, 15)])
        cut = len(draft) // 3
        return draft[:cut] + [(t + 1) % 1000 for t in draft[cut:]]


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    m = ce.load(gemma3_path, threads=2)
    yield m
    m.close()


@pytest.mark.parametrize("length", [548, 589])
def test_gemma3_drafts_rejected_past_a_page_release_leave_plain_decodings_pages(gemma, monkeypatch, length):
    # A stop string ends the reply inside a verified draft whose rows reached past a
    # sliding-window release point: the pages released must be plain decoding's.
    import random
    free_rows(monkeypatch, gemma)
    rng = random.Random(length)
    ids = [rng.randrange(100, 20000) for _ in range(length)]
    c = gemma.context("reference")
    c.append(ids)
    reply = [p.token_id for p in c.generate(40, temperature=0.0, speculative=False)]
    c.delete()
    stop = gemma.detokenize(reply[18:20])
    outs = []
    for speculative in (False, ThirdRight(length, reply)):
        c = gemma.context(f"stop-{bool(speculative)}")
        c.append(ids)
        toks = [p.token_id for p in c.generate(40, temperature=0.0, speculative=speculative, stop=[stop])]
        seq = c._seq
        outs.append((toks, seq.n_tokens, seq.n_released, [seq.export_page(i) for i in range(len(seq.pages))]))
        c.delete()
    assert outs[0] == outs[1]


class Wayward:
    """A custom drafter that guesses right for two tokens, then proposes ``bad`` (no token
    id of the model), and builds its guesses on the list it is given, as a list would let it."""

    def __init__(self, reply, n0, bad):
        self.reply, self.n0, self.bad = reply, n0, bad

    def propose(self, tokens, k):
        done = len(tokens) - self.n0
        guess = list(self.reply[done:done + 2]) + [self.bad] + list(self.reply[done + 2:done + k])
        try:
            tokens += guess[:1]  # on a list: would write into the context
        except TypeError:
            pass
        return guess[:k]


@pytest.mark.parametrize("bad", [-1, 49152, 10**30, 3.0, True, None, "7"])
def test_a_custom_drafters_wrong_ids_and_writes_change_nothing(model, monkeypatch, bad):
    free_rows(monkeypatch, model)
    plain = model.context("wayward-plain")
    plain.append(chat(model, REPEAT), parse_special=True)
    n0 = plain.n_tokens
    want = [p.token_id for p in plain.generate(24, speculative=False, temperature=0.0)]
    spec = model.context("wayward")
    spec.append(chat(model, REPEAT), parse_special=True)
    got = [p.token_id for p in spec.generate(24, speculative=Wayward(want, n0, bad), temperature=0.0)]
    assert got == want and spec.tokens == plain.tokens
    assert spec.speculation.accepted > 0  # the guesses before the bad one were verified and kept
    plain.delete()
    spec.delete()
