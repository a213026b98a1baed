"""Speculative decoding changes no bit: tokens, the logits sampled from, the
sampler's RNG and the final KV bytes equal plain decoding's, whatever is drafted."""
import json
import random
import threading

import pytest

import ctxengine as ce
from ctxengine.engine.sampler import Sampler
from ctxengine.errors import CtxError

DOC = {"name": "ctx-engine", "version": "0.1.0", "license": "MIT",
       "authors": [{"name": "Ada", "email": "ada@example.com"}, {"name": "Linus", "email": "linus@example.com"}],
       "dependencies": {"numpy": ">=1.26", "lmdb": ">=1.4", "zstandard": ">=0.22", "grpcio": ">=1.60"},
       "scripts": {"ctx": "ctxengine.cli.main:main"}, "keywords": ["llm", "gguf", "inference", "context"]}
EDIT = ("Here is a JSON document:\n" + json.dumps(DOC, indent=2)
        + "\nRewrite the whole document, changing only the version to 0.2.0.")
FREE = "Write a short story about a lighthouse keeper who finds a strange machine on the beach."


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


def chat(model, text):
    return model.chat_prompt([{"role": "user", "content": text}])


class Recorder:
    """The logits every sample() was given, as bytes (monkeypatched onto Sampler)."""

    def __init__(self, monkeypatch):
        self.rows: list[bytes] = []
        plain = Sampler.sample

        def sample(sampler, logits, history):
            self.rows.append(logits.tobytes())
            return plain(sampler, logits, history)

        monkeypatch.setattr(Sampler, "sample", sample)

    def take(self) -> list[bytes]:
        rows, self.rows = self.rows, []
        return rows


def run(model, prompt, name, n=48, speculative=None, **sampling):
    """(tokens, sampler state, KV bytes of every page, finish reason, speculation stats)."""
    c = model.context(name)
    if isinstance(prompt, str):
        c.append(prompt, parse_special=True)
    else:
        c.append(prompt)  # token ids
    pieces = list(c.generate(n, speculative=speculative, **sampling))
    seq = c._seq
    kv = [seq.export_page(i) for i in range(len(seq.pages))]
    rng = c.sampler_state["rng"] if "seed" in sampling else None  # unseeded: a random stream each time
    out = ([p.token_id for p in pieces], rng, kv, seq.n_tokens, c.finish_reason, c.speculation)
    c.delete()
    return out


class RandomDrafts:
    """An adversary: random tokens, as many as asked."""

    def __init__(self, seed, n_vocab):
        self.rng, self.n_vocab = random.Random(seed), n_vocab

    def propose(self, tokens, k):
        return [self.rng.randrange(self.n_vocab) for _ in range(k)]


class Oracle:
    """The true continuation (from a plain run), ``width`` tokens at a time, with every
    ``wrong``-th draft token replaced."""

    def __init__(self, prompt_len, reply, width=15, wrong=0):
        self.prompt_len, self.reply, self.width, self.wrong = prompt_len, reply, width, wrong

    def propose(self, tokens, k):
        at = len(tokens) - self.prompt_len
        draft = list(self.reply[at:at + min(k, self.width)])
        if self.wrong and len(draft) > 1:
            draft[-1] = (draft[-1] + 1) % 1000
        return draft


class RowCosts:
    """A step cost per row count for the draft length, in place of the measured one
    (engine/step_cost.py): a step of n rows costs 1 + per_row * (n - 1). With rows
    free, the length follows the acceptance alone, whatever the machine's timings."""

    def __init__(self, per_row=0.0):
        self.per_row = per_row

    def curve(self, rows):
        return [0.0] + [1 + self.per_row * (n - 1) for n in range(1, rows + 1)]

    def observe(self, rows, seconds):
        pass


def free_rows(monkeypatch, model):
    monkeypatch.setattr(model.engine.scheduler, "step_cost", RowCosts(0.0))


SAMPLINGS = [dict(temperature=0.0), dict(temperature=0.7, seed=11),
             dict(temperature=1.2, seed=5, top_k=0, top_p=1.0, min_p=0.0),
             dict(temperature=0.9, seed=3, repeat_penalty=1.2, presence_penalty=0.4)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "t0.7", "t1.2-untruncated", "penalties"])
@pytest.mark.parametrize("text", [EDIT, FREE], ids=["edit", "free"])
def test_lookup_speculation_is_bit_identical(model, monkeypatch, sampling, text):
    if text is EDIT:
        free_rows(monkeypatch, model)  # drafts whatever the machine's load: the count below holds
    rec = Recorder(monkeypatch)
    prompt = chat(model, text)
    plain = run(model, prompt, "plain", speculative=False, **sampling)
    plain_rows = rec.take()
    spec = run(model, prompt, "spec", speculative=True, **sampling)
    assert spec[:5] == plain[:5]
    assert rec.take() == plain_rows  # every logit sampled from, bit for bit
    if text is EDIT and sampling["temperature"] == 0:
        assert spec[5].accepted > len(plain[0]) // 3, spec[5]  # the document is copied: drafts land


@pytest.mark.parametrize("sampling", SAMPLINGS[:2], ids=["greedy", "t0.7"])
def test_logit_bias_under_speculation_is_bit_identical(model, monkeypatch, sampling):
    # The bias is applied to each verified row as to a plain one: a banned token that the
    # document's copy would draft is rejected there, and the rest goes on from the new token.
    free_rows(monkeypatch, model)
    prompt = chat(model, EDIT)
    unbiased = run(model, prompt, "unbiased", speculative=False, **sampling)[0]
    bias = {unbiased[6]: -100, unbiased[11]: 2.5}
    plain = run(model, prompt, "plain", speculative=False, logit_bias=bias, **sampling)
    spec = run(model, prompt, "spec", speculative=True, logit_bias=bias, **sampling)
    assert spec[:5] == plain[:5]
    assert plain[0] != unbiased and unbiased[6] not in plain[0]  # banned
    if sampling["temperature"] == 0:
        assert spec[5].accepted > 0, spec[5]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_adversarial_drafts_change_nothing_and_switch_speculation_off(model, monkeypatch, seed):
    rec = Recorder(monkeypatch)
    prompt = chat(model, FREE)
    sampling = dict(temperature=0.8, seed=seed)
    plain = run(model, prompt, "plain", n=64, speculative=False, **sampling)
    plain_rows = rec.take()
    spec = run(model, prompt, "spec", n=64, speculative=RandomDrafts(seed, model.config.n_vocab), **sampling)
    assert spec[:5] == plain[:5]
    assert rec.take() == plain_rows
    stats = spec[5]
    assert stats.accepted <= 2 and stats.steps <= 12, stats  # it gave up on them


@pytest.mark.parametrize("wrong", [0, 1])
def test_every_acceptance_length_is_bit_identical_across_threads(smollm2_path, model, monkeypatch, wrong):
    prompt = chat(model, EDIT)
    plain = run(model, prompt, "plain", n=40, speculative=False, temperature=0.6, seed=9)
    n_prompt = len(model.tokenize(prompt, parse_special=True))
    one = ce.load(smollm2_path, threads=1)
    free_rows(monkeypatch, one)
    try:
        spec = run(one, prompt, "spec", n=40, speculative=Oracle(n_prompt, plain[0], wrong=wrong),
                   temperature=0.6, seed=9)
    finally:
        one.close()
    assert spec[:5] == plain[:5]
    assert spec[5].accepted > (0 if wrong else len(plain[0]) - 8), spec[5]


def test_grammar_constrained_reply_is_bit_identical(model):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "version": {"type": "string"}},
              "required": ["name", "version"]}
    prompt = chat(model, EDIT + " Answer with the name and the new version as JSON.")
    outs = []
    for name, speculative in (("plain", False), ("spec", True)):
        c = model.context(name)
        c.append(prompt, parse_special=True)
        toks = [p.token_id for p in c.generate(40, json_schema=schema, temperature=0.5, seed=2,
                                               speculative=speculative)]
        outs.append((toks, c.finish_reason, c.sampler_state, c.n_cached))
        c.delete()
    assert outs[0] == outs[1]


def test_relatives_draft_a_regenerated_reply(model, monkeypatch):
    free_rows(monkeypatch, model)
    root = model.context("root")
    root.append(chat(model, FREE), parse_special=True)
    n = root.n_tokens
    first = [p.token_id for p in root.generate(40, temperature=0.0, speculative=False)]
    branch = root.fork("branch", n_tokens=n)
    again = [p.token_id for p in branch.generate(40, temperature=0.0)]
    assert again == first
    assert branch.speculation.accepted >= len(first) - 8, branch.speculation
    branch.delete()
    root.delete()


def test_snapshot_mid_speculation_restores_identically(model, tmp_path):
    prompt = chat(model, EDIT)
    plain = run(model, prompt, "plain", n=48, speculative=False, temperature=0.0)
    store = ce.Store(tmp_path / "store")
    c = model.context("spec")
    c.append(prompt, parse_special=True)
    stream = c.generate(48, temperature=0.0)
    head = [next(stream).token_id for _ in range(20)]
    c.snapshot(store, ref="mid")  # while drafts are in flight
    tail = [p.token_id for p in stream]
    assert head + tail == plain[0]
    restored = model.restore(store, "mid", name="restored")
    assert restored.tokens == c.tokens[:len(restored.tokens)]
    rest = [p.token_id for p in restored.generate(48 - 20, temperature=0.0)]
    assert head + rest == plain[0]
    seq = restored._seq
    assert [seq.export_page(i) for i in range(len(seq.pages))] == plain[2]
    c.delete()
    restored.delete()


def test_speculative_and_plain_sequences_share_steps(model, monkeypatch):
    free_rows(monkeypatch, model)
    prompt = chat(model, EDIT)
    n_prompt = len(model.tokenize(prompt, parse_special=True))
    alone = run(model, prompt, "alone", n=40, speculative=False, temperature=0.0)
    results = {}

    def go(name, speculative):
        results[name] = run(model, prompt, name, n=40, speculative=speculative, temperature=0.0)

    history = model.engine.scheduler.history
    history.clear()
    threads = [threading.Thread(target=go, args=("spec", Oracle(n_prompt, alone[0], width=2))),
               threading.Thread(target=go, args=("plain", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["spec"][:5] == alone[:5] and results["plain"][:5] == alone[:5]
    # 3 rows (a token and 2 drafts) and 1 row in one step: 4 decode rows.
    assert any(d == 4 for d, _ in history), list(history)


def test_a_model_drafts_for_itself(smollm2_path, model, monkeypatch):
    prompt = chat(model, FREE)
    plain = run(model, prompt, "plain", n=32, speculative=False, temperature=0.0)
    drafted = ce.load(smollm2_path, threads=2, draft=smollm2_path)
    free_rows(monkeypatch, drafted)
    try:
        spec = run(drafted, prompt, "spec", n=32, temperature=0.0)
    finally:
        drafted.close()
    assert spec[:5] == plain[:5]
    assert spec[5].accepted == spec[5].drafted >= len(plain[0]) - 6, spec[5]  # each verify adds one of its own


def test_a_model_drafting_for_itself_takes_no_page_plain_decoding_needs(smollm2_path, page_bytes, monkeypatch):
    # Its fork's pages came straight from the pool, promised to no one: in a pool that fits
    # two plain streams exactly, the other stream's reserved step found it full and failed.
    from ctxengine.engine.engine import Engine
    from ctxengine.state.model import Model, attach_draft

    engine = Engine(smollm2_path, threads=2, kv_budget=16 * page_bytes)
    attach_draft(engine, smollm2_path)
    model = Model(engine)
    free_rows(monkeypatch, model)
    page = engine.scheduler.page_tokens
    prompt = model.tokenize(chat(model, EDIT), parse_special=True)[:6 * page - 8]  # + 40: 8 pages a stream
    got = {}

    def stream(name, speculative):
        c = model.context(name)
        try:
            c.append(prompt)
            got[name] = [p.token_id for p in c.generate(40, temperature=0.0, speculative=speculative)]
            got[name + " drafted"] = c.speculation.drafted
        except CtxError as err:
            got[name] = str(err)
        finally:
            c.delete()

    try:
        for _ in range(2):
            threads = [threading.Thread(target=stream, args=("drafts", None)),
                       threading.Thread(target=stream, args=("plain", False))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert got["drafts"] == got["plain"] and len(got["plain"]) == 40, got
            assert got["drafts drafted"] > 0  # it drafted, from pages no one was promised
    finally:
        model.close()


def test_a_draft_with_another_vocabulary_is_refused(smollm2_path, gemma3_path):
    with pytest.raises(CtxError, match=r"another vocabulary .* token \d+ is b'.*' there, b'.*' here"):
        ce.load(smollm2_path, threads=1, draft=gemma3_path)


# -- the draft sources and the draft length, alone ---------------------------------------
def test_lookup_follows_the_longest_most_recent_match():
    from ctxengine.engine.speculative import LookupDrafter

    toks = [1, 2, 3, 4, 5, 9, 9, 2, 3, 4, 7, 8, 2, 3]
    d = LookupDrafter(toks)
    assert d.propose(toks, 3) == [4, 7, 8]   # "2 3" last seen before "4 7 8"
    toks += [4, 5]
    assert d.propose(toks, 3) == [9, 9, 2]   # "2 3 4 5" (longest) matches the start, not "3 4 7"
    assert d.propose([6, 6], 3) == []


def test_lookup_continues_a_loop_past_the_end():
    from ctxengine.engine.speculative import LookupDrafter

    toks = [5, 6, 1, 2, 1, 2, 1, 2]  # a reply caught in a loop: "1 2" repeats with period 2
    assert LookupDrafter(toks).propose(toks, 5) == [1, 2, 1, 2, 1]
    theirs = [5, 6, 1, 2]  # a relative's text ends where it ends: no loop is read into it
    assert LookupDrafter([9, 5, 6], [(theirs, 0)]).propose([9, 5, 6], 5) == [1, 2]


def test_lookup_drafts_from_a_relatives_growing_tokens():
    from ctxengine.engine.speculative import LookupDrafter

    mine, theirs = [1, 2, 3], [1, 2, 3, 10, 11]
    d = LookupDrafter(mine, [(theirs, 3)])
    assert d.propose(mine, 4) == [10, 11]
    theirs += [12, 13]
    assert d.propose(mine, 4) == [10, 11, 12, 13]


# Step costs relative to one row, as measured for 1, 2, 3, 4, 6, 8, 12, 16 rows on Gemma 3
# 270M (machine B, 2 threads): a row of its 262,144-token output projection is not free.
GEMMA_ROWS = {1: 1.0, 2: 1.38, 3: 1.53, 4: 1.55, 6: 1.72, 8: 1.99, 12: 2.94, 16: 4.53}


def gemma_costs(rows):
    pts = sorted(GEMMA_ROWS)
    out = [0.0]
    for n in range(1, rows + 1):
        lo = max(r for r in pts if r <= n)
        hi = min((r for r in pts if r >= n), default=lo)
        out.append(GEMMA_ROWS[lo] if hi == lo else
                   GEMMA_ROWS[lo] + (n - lo) / (hi - lo) * (GEMMA_ROWS[hi] - GEMMA_ROWS[lo]))
    return out


def landed(length, drafts, k):
    for _ in range(drafts):
        length.update(k, k)
    return length


def test_draft_length_follows_the_step_costs():
    from ctxengine.engine.speculative import MAX_DRAFT, DraftLength

    sure = landed(DraftLength(), 10, 8)  # every drafted token accepted, ten drafts in a row
    assert 0.95 < sure.p < 1
    assert sure.choose(RowCosts(0.0).curve(16)) == MAX_DRAFT   # rows free: the longest draft
    assert 4 <= sure.choose(gemma_costs(16)) <= 11              # from 12 rows Gemma's steps grow fast
    assert sure.choose(RowCosts(1.0).curve(16)) == 0            # a row costs a step: never
    assert not sure.active
    assert DraftLength().choose(RowCosts(1.0).curve(16)) == 1   # but once, to learn p: a probe


def test_draft_length_follows_the_acceptance_and_pauses():
    from ctxengine.engine.speculative import DraftLength

    costs = gemma_costs(16)
    length = DraftLength()
    assert length.p == 0.5 and 1 <= length.choose(costs) <= 3  # the prior: short drafts
    for _ in range(3):
        length.update(2, 0)  # none lands
    assert length.p < 0.2 and length.choose(costs) == 0 and not length.active
    for _ in range(DraftLength.COOLDOWN[0]):
        length.plain_step()
    assert length.active and length.p == 0.5  # it tries again, from the prior
    assert length.choose(RowCosts(1.0).curve(16)) == 1  # a probe, even where the prior does not pay
    length.update(2, 0)
    length.update(2, 0)
    assert length.choose(costs) == 0
    for _ in range(DraftLength.COOLDOWN[0]):
        length.plain_step()
    assert not length.active  # paused twice as long


def test_draft_length_among_other_streams_counts_their_rows():
    from ctxengine.engine.speculative import DraftLength

    sure = landed(DraftLength(), 10, 8)
    costs = RowCosts(0.25).curve(16)  # each row a quarter of a step: 8 streams' step is 2.75
    assert sure.choose(costs, others=0, k_max=7) == 7  # alone, even 8 rows pay
    assert sure.choose(costs, others=7, k_max=1) == 1  # 9 tokens in 3.0 beat 8 in 2.75
    low = DraftLength()
    low.update(4, 0)
    assert low.choose(costs, others=7, k_max=1) == 0 and not low.active
    # A probe among others: the prior would take the whole share; it takes PROBE.
    assert DraftLength().choose(RowCosts(0.01).curve(24), others=7, k_max=15) == DraftLength.PROBE


@pytest.mark.parametrize("per_row", [0.0, 0.3, 1.0])
def test_the_draft_length_never_changes_the_output(model, monkeypatch, per_row):
    rec = Recorder(monkeypatch)
    prompt = chat(model, EDIT)
    plain = run(model, prompt, "plain", speculative=False, temperature=0.0)
    plain_rows = rec.take()
    monkeypatch.setattr(model.engine.scheduler, "step_cost", RowCosts(per_row))
    spec = run(model, prompt, "spec", speculative=True, temperature=0.0)
    assert spec[:5] == plain[:5]
    assert rec.take() == plain_rows
    if per_row == 1.0:
        assert spec[5].steps <= 4, spec[5]  # a row costs a step: only probes, ever rarer
    else:
        assert spec[5].accepted > len(plain[0]) // 2, spec[5]


def test_gemma3_past_its_sliding_window(gemma3_path, monkeypatch):
    """Verified rows that are dropped right where the window releases pages: the
    page table steps back within its page of slack, and the bits stay plain decoding's."""
    gemma = ce.load(gemma3_path, threads=2)
    free_rows(monkeypatch, gemma)  # so it drafts, half its drafts failing, whatever its timings
    try:
        window = gemma.config.swa_window
        text = (EDIT + " ") * 8
        ids = gemma.tokenize(text, add_bos=True)[: window - 8]  # the reply crosses the window
        plain = run(gemma, ids, "plain", n=40, speculative=False, temperature=0.0)
        spec = run(gemma, ids, "spec", n=40, speculative=Oracle(len(ids), plain[0], wrong=1), temperature=0.0)
    finally:
        gemma.close()
    assert spec[:5] == plain[:5]
    assert spec[5].accepted > 10, spec[5]
