"""Sampler chain, its RNG and state, and stop strings."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ctxengine.engine.sampler import (Sampler, SamplerParams, StopMatcher, apply_bias, apply_penalties,
                                      sample_candidates, splitmix64, top_k_ids, uniform)
from ctxengine.errors import CtxError

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)  # every filter off
LAST = 1 - 2 ** -53  # u this close to 1 picks the last survivor of the chain


def random_logits(rng, n=1000, scale=3.0):
    return (rng.standard_normal(n) * scale).astype(np.float32)


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


# -- RNG ------------------------------------------------------------------------------
def test_splitmix64_reference_outputs():
    # The published sequence for seed 1234567: the generator, hence every seeded run, is pinned.
    state, out = 1234567, []
    for _ in range(5):
        state, bits = splitmix64(state)
        out.append(bits)
    assert out == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                   4593380528125082431, 16408922859458223821]


def test_uniform_covers_zero_to_below_one():
    assert uniform(0) == 0.0
    assert uniform((1 << 64) - 1) == LAST < 1.0


# -- greedy and the filters -------------------------------------------------------------
def test_greedy_is_argmax_and_draws_nothing():
    rng = np.random.default_rng(1)
    s = Sampler(SamplerParams(temperature=0, seed=5))
    before = s.state()
    for _ in range(50):
        x = random_logits(rng)
        assert s.sample(x, []) == int(np.argmax(x))
    assert s.state() == before


def test_greedy_ties_go_to_lowest_id():
    x = np.array([0.0, 3.0, 1.0, 3.0, 3.0], dtype=np.float32)
    assert Sampler(SamplerParams(temperature=0)).sample(x, []) == 1


def test_top_k_1_is_greedy():
    rng = np.random.default_rng(2)
    s = Sampler(SamplerParams(temperature=1.5, top_k=1, top_p=1.0, min_p=0.0, seed=3))
    for _ in range(200):
        x = random_logits(rng)
        assert s.sample(x, []) == int(np.argmax(x))


def test_top_k_ids_are_the_k_largest_with_ties_to_lowest_ids():
    x = np.array([5, 1, 4, 4, 9, 4, 0], dtype=np.float32)
    assert top_k_ids(x, 3).tolist() == [0, 2, 4]     # 9, 5 and the first 4
    assert top_k_ids(x, 4).tolist() == [0, 2, 3, 4]
    assert top_k_ids(x, 0).tolist() == list(range(7))  # off
    assert top_k_ids(x, 99).tolist() == list(range(7))


def test_top_k_keeps_samples_inside_the_top_k():
    rng = np.random.default_rng(3)
    x = random_logits(rng, scale=0.5)  # flat: the cut matters
    top = set(np.argsort(-x)[:5].tolist())
    s = Sampler(SamplerParams(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0, seed=4))
    seen = {s.sample(x, []) for _ in range(500)}
    assert seen == top


@pytest.mark.parametrize("top_p", [1e-9, 0.0])  # 0 was refused; OpenAI and Anthropic document [0, 1]
def test_tiny_top_p_keeps_only_the_top_token(top_p):
    rng = np.random.default_rng(4)
    s = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=top_p, min_p=0.0, seed=6))
    for _ in range(100):
        x = random_logits(rng, scale=0.3)
        assert s.sample(x, []) == int(np.argmax(x))


@pytest.mark.parametrize("top_p, survivors", [(0.45, 1), (0.75, 2), (0.85, 3), (0.9, 3), (0.97, 4), (1.0, 4)])
def test_top_p_keeps_the_shortest_prefix_reaching_p(top_p, survivors):
    probs = np.array([0.15, 0.5, 0.05, 0.3])  # order: ids 1, 3, 0, 2
    x = np.log(probs).astype(np.float32)
    p = SamplerParams(temperature=1.0, top_k=0, top_p=top_p, min_p=0.0)
    assert sample_candidates(x, p, LAST) == [1, 3, 0, 2][survivors - 1]
    assert sample_candidates(x, p, 0.0) == 1


@pytest.mark.parametrize("min_p, last", [(0.0, 2), (0.05, 2), (0.11, 0), (0.35, 3), (0.61, 1), (1.0, 1)])
def test_min_p_keeps_tokens_at_least_min_p_times_the_top(min_p, last):
    probs = np.array([0.15, 0.5, 0.05, 0.3])  # ratios to the top: 0.3, 1, 0.1, 0.6
    x = np.log(probs).astype(np.float32)
    p = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=min_p)
    assert sample_candidates(x, p, LAST) == last


def test_top_p_is_taken_before_min_p_over_the_top_k_survivors():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    x = np.log(probs).astype(np.float32)
    # top_k=3 renormalises to 4/9, 3/9, 2/9: top_p=0.7 needs the first two (7/9 >= 0.7).
    assert sample_candidates(x, SamplerParams(temperature=1, top_k=3, top_p=0.7, min_p=0.0), LAST) == 1
    # Over all four, 0.4 + 0.3 also reaches 0.7, but 0.75 needs a third token...
    assert sample_candidates(x, SamplerParams(temperature=1, top_k=0, top_p=0.75, min_p=0.0), LAST) == 2
    # ...which min_p=0.6 (ratio 0.5) removes again: the shorter cut wins.
    assert sample_candidates(x, SamplerParams(temperature=1, top_k=0, top_p=0.75, min_p=0.6), LAST) == 1
    # min_p=0.4 keeps three; had it run first, top_p over those three (4/9 + 3/9) would keep two.
    assert sample_candidates(x, SamplerParams(temperature=1, top_k=0, top_p=0.75, min_p=0.4), LAST) == 2


def test_masked_tokens_are_never_drawn():
    x = np.full(50, -np.inf, dtype=np.float32)
    x[[7, 30]] = [0.0, 0.5]
    s = Sampler(SamplerParams(temperature=1.0, seed=8, **OFF))
    assert {s.sample(x, []) for _ in range(300)} == {7, 30}
    assert sample_candidates(x, SamplerParams(temperature=1.0, **OFF), LAST) in (7, 30)


def test_bad_logits_are_refused():
    s = Sampler(SamplerParams(seed=1))
    with pytest.raises(CtxError, match="NaN"):
        s.sample(np.array([0.0, np.nan], dtype=np.float32), [])
    with pytest.raises(CtxError, match="NaN or \\+inf"):
        s.sample(np.array([0.0, np.inf], dtype=np.float32), [])
    with pytest.raises(CtxError, match="-inf"):
        s.sample(np.full(4, -np.inf, dtype=np.float32), [])
    with pytest.raises(CtxError, match="vector"):
        s.sample(np.zeros((2, 2), dtype=np.float32), [])


# -- penalties ----------------------------------------------------------------------------
def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    x = np.array([2.0, -2.0, 1.0, -1.0, 4.0], dtype=np.float32)
    out = apply_penalties(x, [0, 1, 0], SamplerParams(repeat_penalty=2.0))
    assert out.tolist() == [1.0, -4.0, 1.0, -1.0, 4.0]  # counted once each, like llama.cpp
    assert x.tolist() == [2.0, -2.0, 1.0, -1.0, 4.0]    # the caller's logits are untouched


def test_repeat_window_is_the_last_repeat_last_n_tokens():
    x = np.ones(5, dtype=np.float32)
    history = [0, 1, 2, 3]
    assert apply_penalties(x, history, SamplerParams(repeat_penalty=2.0, repeat_last_n=2)).tolist() == \
        [1, 1, 0.5, 0.5, 1]
    assert apply_penalties(x, history, SamplerParams(repeat_penalty=2.0, repeat_last_n=-1)).tolist() == \
        [0.5, 0.5, 0.5, 0.5, 1]
    assert apply_penalties(x, history, SamplerParams(repeat_penalty=2.0, repeat_last_n=0)) is x


def test_frequency_and_presence_penalties_follow_openai():
    x = np.zeros(4, dtype=np.float32)
    out = apply_penalties(x, [2, 2, 2, 0], SamplerParams(frequency_penalty=0.5, presence_penalty=0.25))
    assert out.tolist() == [-0.75, 0.0, -1.75, 0.0]  # count * 0.5 + 0.25 where count > 0


def test_penalties_steer_greedy_away_from_repeats():
    x = np.array([3.0, 2.9, 0.0], dtype=np.float32)
    s = Sampler(SamplerParams(temperature=0, repeat_penalty=1.1))
    assert s.sample(x, []) == 0
    assert s.sample(x, [0]) == 1


def test_history_outside_the_vocabulary_is_refused():
    with pytest.raises(CtxError, match="outside the vocabulary"):
        Sampler(SamplerParams(repeat_penalty=1.1)).sample(np.zeros(4, dtype=np.float32), [1, 4])


# -- logit bias --------------------------------------------------------------------------------
def test_logit_bias_is_added_before_the_penalties_and_steers_greedy():
    x = np.array([3.0, 2.5, 0.0, -1.0], dtype=np.float32)
    assert Sampler(SamplerParams(temperature=0, logit_bias={"3": 4.5})).sample(x, []) == 3   # -1 + 4.5 > 3
    assert Sampler(SamplerParams(temperature=0, logit_bias=[[0, -100]])).sample(x, []) == 1  # banned
    # llama.cpp's order: the bias first, then repeat_penalty divides the biased positive logit
    s = Sampler(SamplerParams(temperature=0, repeat_penalty=2.0, logit_bias={2: 2.0}))
    assert s.sample(np.array([1.5, 0.0, 0.0], dtype=np.float32), [2]) == 0  # (0 + 2) / 2 = 1 < 1.5
    assert x.tolist() == [3.0, 2.5, 0.0, -1.0]  # the caller's logits are untouched


def test_logit_bias_changes_only_the_listed_tokens_in_float32():
    x = random_logits(np.random.default_rng(21), 50)
    p = SamplerParams(logit_bias={7: 0.1, 30: -2.75, 49: 100})
    ids, bias = np.array([i for i, _ in p.logit_bias]), np.array([b for _, b in p.logit_bias], np.float32)
    want = x.copy()
    for i, b in p.logit_bias:
        want[i] = np.float32(x[i]) + np.float32(b)
    got = apply_bias(x, ids, bias)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert not np.array_equal(x, want)  # a copy: the caller's logits are untouched


def test_logit_bias_is_kept_in_the_state_and_normalised():
    p = SamplerParams(temperature=1.0, seed=3, logit_bias={"12": 1, 4: -0.5})
    assert p.logit_bias == ((4, -0.5), (12, 1.0))
    assert p == SamplerParams(temperature=1.0, seed=3, logit_bias=[(12, 1.0), (4, -0.5)])
    state = json.loads(json.dumps(Sampler(p).state()))
    assert state["params"]["logit_bias"] == [[4, -0.5], [12, 1.0]]
    assert Sampler.from_state(state).params == p


@pytest.mark.parametrize("bias", [
    {"x": 1}, {"-1": 1}, {"1.5": 1}, {"٣": 1}, {1: 101}, {1: -100.5}, {1: math.nan}, {1: "big"}, {1: True},
    "1:5", [[1]], [[1, 2, 3]], 5,
])
def test_bad_logit_bias_is_refused(bias):
    with pytest.raises(CtxError, match="logit_bias"):
        SamplerParams(logit_bias=bias)


def test_logit_bias_outside_the_vocabulary_is_refused():
    with pytest.raises(CtxError, match="token id 9, outside the vocabulary"):
        Sampler(SamplerParams(logit_bias={9: 1.0})).sample(np.zeros(4, dtype=np.float32), [])


# -- the distribution -------------------------------------------------------------------------
@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 0), (1.3, 5)])
def test_empirical_distribution_matches_softmax(temperature, top_k):
    x = np.array([1.0, 0.5, 0.0, -0.5, 2.0, 1.5, -1.0, 0.2], dtype=np.float32)
    expected = softmax(x.astype(np.float64) / temperature)
    if top_k:
        expected[np.argsort(-x)[top_k:]] = 0
        expected /= expected.sum()
    s = Sampler(SamplerParams(temperature=temperature, seed=12345, **{**OFF, "top_k": top_k}))
    n = 20000
    counts = np.bincount([s.sample(x, []) for _ in range(n)], minlength=len(x))
    live = expected > 0
    assert counts[~live].sum() == 0
    chi2 = (((counts - n * expected)[live]) ** 2 / (n * expected[live])).sum()
    assert chi2 < 26.1  # chi-square 99.9% point for 7 degrees of freedom (fewer here: stricter)


# -- seeds and state ---------------------------------------------------------------------------
def draws(sampler, rng, steps, history):
    out = []
    for _ in range(steps):
        token = sampler.sample(random_logits(rng, n=300, scale=1.5), history)
        history.append(token)
        out.append(token)
    return out


PENALISED = SamplerParams(temperature=0.9, top_k=50, top_p=0.9, min_p=0.02, repeat_penalty=1.1,
                          frequency_penalty=0.1, presence_penalty=0.1, seed=2024)


def test_same_seed_same_sequence():
    a = draws(Sampler(PENALISED), np.random.default_rng(7), 400, [])
    b = draws(Sampler(PENALISED), np.random.default_rng(7), 400, [])
    c = draws(Sampler(SamplerParams(**{**PENALISED.to_dict(), "seed": 2025})), np.random.default_rng(7), 400, [])
    assert a == b
    assert a != c
    assert len(set(a)) > 50  # it did sample


def test_state_round_trip_continues_identically():
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    a, history_a = Sampler(PENALISED), []
    b, history_b = Sampler(PENALISED), []
    draws(a, rng_a, 150, history_a)
    draws(b, rng_b, 150, history_b)
    saved = json.loads(json.dumps(b.state()))  # as a snapshot stores it
    restored = Sampler.from_state(saved)
    assert restored.state() == a.state()
    assert draws(restored, rng_b, 300, history_b) == draws(a, rng_a, 300, history_a)


def test_random_seed_is_recorded_in_the_state():
    s = Sampler(SamplerParams(temperature=1.0))
    seed = s.state()["params"]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2 ** 53
    rng = np.random.default_rng(11)
    x = [random_logits(rng) for _ in range(50)]
    again = Sampler(SamplerParams(temperature=1.0, seed=seed))
    assert [s.sample(v, []) for v in x] == [again.sample(v, []) for v in x]


def test_with_params_continues_the_stream():
    rng = np.random.default_rng(13)
    x = [random_logits(rng) for _ in range(40)]
    a = Sampler(SamplerParams(temperature=1.0, seed=99, **OFF))
    first = [a.sample(v, []) for v in x[:20]]
    b = Sampler.from_state(a.state()).with_params(SamplerParams(temperature=1.0, **OFF))
    assert b.params.seed == 99
    assert [b.sample(v, []) for v in x[20:]] == [a.sample(v, []) for v in x[20:]]
    restarted = b.with_params(SamplerParams(temperature=1.0, seed=99, **OFF))
    assert [restarted.sample(v, []) for v in x[:20]] == first


def test_state_is_small_plain_json():
    state = Sampler(PENALISED).state()
    assert json.loads(json.dumps(state)) == state
    assert state["rng"] == {"algorithm": "splitmix64", "state": f"{2024:016x}"}
    assert len(json.dumps(state)) < 400


@pytest.mark.parametrize("bad", [
    None, [], {"format": "other"},
    {"format": "ctxengine.sampler/1", "params": {}, "rng": {"algorithm": "mt19937", "state": "0" * 16}},
    {"format": "ctxengine.sampler/1", "params": {}, "rng": {"algorithm": "splitmix64", "state": "xyz"}},
    {"format": "ctxengine.sampler/1", "params": {"top_p": 2}, "rng": {"algorithm": "splitmix64", "state": "0" * 16}},
    {"format": "ctxengine.sampler/1", "params": {"warp": 1}, "rng": {"algorithm": "splitmix64", "state": "0" * 16}},
])
def test_bad_states_are_refused(bad):
    with pytest.raises(CtxError):
        Sampler.from_state(bad)


# -- parameters -------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf), ("temperature", "hot"),
    ("top_k", -1), ("top_k", 1.5), ("top_k", True), ("top_p", -0.1), ("top_p", 1.01), ("min_p", -0.1),
    ("min_p", 1.5), ("repeat_penalty", 0.0), ("repeat_last_n", -2), ("presence_penalty", math.nan),
    ("frequency_penalty", None), ("seed", -1), ("seed", 2 ** 64), ("seed", 1.0),
])
def test_nonsense_params_are_refused(field, value):
    with pytest.raises(CtxError, match=field):
        SamplerParams(**{field: value})


def test_params_dict_round_trip():
    p = SamplerParams(temperature=1, top_k=np.int64(7), seed=3)
    d = p.to_dict()
    assert d["temperature"] == 1.0 and isinstance(d["temperature"], float) and type(d["top_k"]) is int
    assert SamplerParams.from_dict(json.loads(json.dumps(d))) == p
    assert SamplerParams.from_dict({}) == SamplerParams()
    with pytest.raises(CtxError, match="unknown sampling option"):
        SamplerParams.from_dict({"temp": 1})


# -- stop strings ------------------------------------------------------------------------------------
def run(matcher, pieces):
    out = []
    for piece in pieces:
        text, hit = matcher.push(piece)
        out.append(text)
        if hit:
            return out, True
    return out + [matcher.flush()], False


def test_no_stops_passes_text_through_at_once():
    m = StopMatcher([])
    assert m.push("abc") == ("abc", False)
    assert m.flush() == ""


def test_stop_inside_one_piece():
    assert run(StopMatcher(["</s>"]), ["Hello</s> world"]) == (["Hello"], True)


def test_stop_split_across_pieces_is_held_back():
    assert run(StopMatcher(["</s>"]), ["Hello <", "/", "s", ">more"]) == (["Hello ", "", "", ""], True)


def test_a_false_start_is_released():
    m = StopMatcher(["</s>"])
    assert m.push("a</") == ("a", False)
    assert m.push("x") == ("</x", False)
    assert m.push("<") == ("", False)
    assert m.flush() == "<"


def test_overlapping_prefix():
    out, hit = run(StopMatcher(["abcd"]), list("xababcdz"))
    assert hit and "".join(out) == "xab"


def test_earliest_of_several_stops_wins():
    assert run(StopMatcher(["world", "lo w"]), ["hello world"]) == (["hel"], True)
    assert run(StopMatcher(["abc", "ab"]), ["xa", "bc"]) == (["x", ""], True)
    assert run(StopMatcher(["\n\n", "User:"]), ["Sure.", "\n", "User", ":"]) == (["Sure.", "", "\n", ""], True)


def test_nothing_after_a_stop():
    m = StopMatcher(["."])
    assert m.push("end. more") == ("end", True)
    assert m.push("text") == ("", True)
    assert m.flush() == ""


@pytest.mark.parametrize("stops", [[""], ["ok", 3], "stop"])
def test_bad_stops_are_refused(stops):
    with pytest.raises(CtxError):
        StopMatcher(stops)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.text(alphabet="ab<>", max_size=6), max_size=12),
       stops=st.lists(st.text(alphabet="ab<>", min_size=1, max_size=4), max_size=3))
def test_emitted_text_is_the_input_up_to_the_first_stop(pieces, stops):
    # The stream stops at the first piece after which the text so far holds a
    # stop string, and is cut where the earliest-starting one found then begins.
    # (So pieces "><", "<" with stops "<", "><<" stop at "<": "><<" is not
    # complete yet when "<" is.)
    text, found = "".join(pieces), []
    for k in range(1, len(pieces) + 1):
        text = "".join(pieces[:k])
        found = [i for i in (text.find(s) for s in stops) if i >= 0]
        if found:
            break
    m = StopMatcher(stops)
    emitted, consumed = "", ""
    for piece in pieces:
        out, hit = m.push(piece)
        emitted += out
        consumed += piece
        if hit:
            break
        # What is held back is as little as possible: a proper prefix of some stop.
        held = consumed[len(emitted):]
        assert consumed.startswith(emitted)
        assert held == "" or any(s.startswith(held) and s != held for s in stops)
    else:
        emitted += m.flush()
        hit = False
    assert hit == bool(found)
    assert emitted == (text[: min(found)] if found else text)
