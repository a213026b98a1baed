"""Constrained decode (three JSON Schemas) against unconstrained decode on SmolLM2 (issues 12, 20).

    python bench/bench_grammar.py [-m MODEL] [--threads 2] [--rounds 7] [--tokens 128] [--json]

Each round runs every variant from the same prefilled prompt (a fork, so no
prefill is timed), in an order that rotates from round to round, and the
table reports medians over the rounds (the machine may be shared and noisy).
Variants: unconstrained; each schema with the next mask computed while the
forward pass runs (the default, ``Constraint.prefetch``); and each schema
with the mask in series after it (prefetch off), to show what the overlap
buys. Decode is greedy, timed from the first token to the last; the prompt
is plain text, so the variants decode about the same number of tokens.
Per-token grammar time is measured inside the constrained runs: the mask
(what the sampler waits for: the bitmask, or what is left of computing it
when the forward is done, plus setting the other logits to -inf) and the
advance (the matcher consuming the sampled token).
Goal: constrained tokens/s >= 0.97x unconstrained.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SCHEMA = {
    "type": "object",
    "properties": {"people": {"type": "array", "minItems": 6, "maxItems": 6, "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
                       "city": {"type": "string", "maxLength": 16},
                       "role": {"enum": ["engineer", "doctor", "teacher", "artist"]}},
        "required": ["name", "age", "city", "role"], "additionalProperties": False}}},
    "required": ["people"], "additionalProperties": False,
}
# The schema of issue 20's measurement: an array of strings.
STRINGS = {"type": "object", "properties": {"names": {"type": "array", "minItems": 24, "maxItems": 24,
                                                      "items": {"type": "string", "maxLength": 24}}},
           "required": ["names"], "additionalProperties": False}
# Keys of the reply's own choosing (json_object's schema): each key is written once, a mask over
# the keys so far beside the grammar's (text/json_keys_once.py).
SCHEMAS = {"people": SCHEMA, "strings": STRINGS, "object": {"type": "object"}}
# A plain-text prompt (no chat template), so that the unconstrained variant
# writes on for as many tokens as the constrained one instead of ending its turn.
PROMPT = "Here are six people, with their name, age, city and job, written as JSON:\n"


class Timed:
    """Wraps Constraint.mask and Constraint.advance to add up the time spent in them."""

    def __init__(self):
        from ctxengine.text.grammar import Constraint

        self.reset()
        Constraint.mask = self._wrap(Constraint.mask, "mask_s")
        Constraint.advance = self._wrap(Constraint.advance, "advance_s")

    def _wrap(self, fn, slot: str):
        def timed(c, arg):
            t = time.perf_counter()
            try:
                return fn(c, arg)
            finally:
                setattr(self, slot, getattr(self, slot) + time.perf_counter() - t)
                self.calls += slot == "mask_s"

        return timed

    def reset(self):
        self.mask_s = self.advance_s = 0.0
        self.calls = 0


def run(base, n_tokens: int, schema) -> tuple[int, float]:
    """(tokens, seconds) of a greedy decode, timed from the first token to the last
    (the first one's step recomputes the fork's last logits: not decode)."""
    ctx = base.fork()
    try:
        # close_json off: the reply is cut at n_tokens, so every token is sampled under the mask
        # (closing within the budget would write the schema's shortest completion instead);
        # speculation off: the mask's cost alone.
        pieces = ctx.generate(n_tokens, temperature=0.0, json_schema=schema, close_json=False, speculative=False)
        stamps = [time.perf_counter() for p in pieces if p.token_id is not None]
        return len(stamps) - 1, stamps[-1] - stamps[0]
    finally:
        ctx.delete()


def serial(on: bool) -> None:
    """Turn the mask's overlap with the forward pass off (on=True) or back on."""
    from ctxengine.text.grammar import Constraint

    if not hasattr(Constraint, "_overlapped_prefetch"):
        Constraint._overlapped_prefetch = Constraint.prefetch
    Constraint.prefetch = (lambda self: None) if on else Constraint._overlapped_prefetch


def measure(base, args, timer) -> dict:
    """Every variant, rounds rotating their order: {variant: {rate, tokens, mask_us, advance_us}} lists."""
    variants = ["free"] + [f"{k}{how}" for k in SCHEMAS for how in ("", " serial")]
    got = {v: {"rate": [], "tokens": [], "mask_us": [], "advance_us": []} for v in variants}
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            schema = SCHEMAS.get(v.split()[0])
            serial(v.endswith("serial"))
            timer.reset()
            n, dt = run(base, args.tokens, schema)
            got[v]["rate"].append(n / dt)
            got[v]["tokens"].append(n)
            if schema is not None:
                got[v]["mask_us"].append(timer.mask_s / timer.calls * 1e6)
                got[v]["advance_us"].append(timer.advance_s / timer.calls * 1e6)
    serial(False)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import ctxengine as ce
    from ctxengine import _core

    model = ce.load(args.model, threads=args.threads)
    base = model.context("bench")
    base.append(PROMPT)
    timer = Timed()
    run(base, 8, SCHEMA)  # warm-up: the vocabulary for llguidance is built once per tokenizer
    got = measure(base, args, timer)
    free = statistics.median(got["free"]["rate"])
    rows = {v: {"tokens": statistics.median(g["tokens"]), "tok_s": round(statistics.median(g["rate"]), 2),
                "ratio": round(statistics.median(g["rate"]) / free, 3),
                "mask_us": round(statistics.median(g["mask_us"]), 1) if g["mask_us"] else None,
                "advance_us": round(statistics.median(g["advance_us"]), 1) if g["advance_us"] else None}
            for v, g in got.items()}
    out = {"model": model.name, "threads": args.threads, "isa": _core.active_isa(), "rounds": args.rounds,
           "variants": rows}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{model.name}, {args.threads} threads, {args.rounds} rounds rotating, medians (ISA: {out['isa']})")
    print("| decode | tokens | tokens/s | vs unconstrained | mask / token | advance / token |")
    print("| --- | --- | --- | --- | --- | --- |")
    for v, row in rows.items():
        us = (lambda x: "-" if x is None else f"{x:.0f} us")
        print(f"| {v} | {row['tokens']:.0f} | {row['tok_s']:.1f} | {row['ratio']:.2f}x | {us(row['mask_us'])} | "
              f"{us(row['advance_us'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
