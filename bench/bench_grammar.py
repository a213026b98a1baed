"""Constrained decode (a JSON Schema) against unconstrained decode on SmolLM2 (issue 12).

    python bench/bench_grammar.py [-m MODEL] [--threads 2] [--rounds 7] [--tokens 128] [--json]

Each round runs both variants from the same prefilled prompt (a fork, so no
prefill is timed), alternating which goes first, and the table reports
medians over the rounds (the machine is shared and noisy). Decode is greedy,
timed from the first token to the last; the prompt is plain text, so both
variants decode the same number of tokens.
Per-token grammar time is measured inside the constrained runs: the mask
(llguidance computing the allowed-token bitmask, plus setting the other
logits to -inf) and the advance (the matcher consuming the sampled token).
Goal: constrained tokens/s >= 0.9x unconstrained.
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
        stamps = [time.perf_counter() for p in ctx.generate(n_tokens, temperature=0.0, json_schema=schema,
                                                            speculative=False)  # the mask's cost alone
                  if p.token_id is not None]
        return len(stamps) - 1, stamps[-1] - stamps[0]
    finally:
        ctx.delete()


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
    rates = {"free": [], "schema": []}
    mask_us, advance_us, counts = [], [], {"free": [], "schema": []}
    for r in range(args.rounds):
        for variant in (("free", "schema") if r % 2 == 0 else ("schema", "free")):
            timer.reset()
            n, dt = run(base, args.tokens, SCHEMA if variant == "schema" else None)
            rates[variant].append(n / dt)
            counts[variant].append(n)
            if variant == "schema":
                mask_us.append(timer.mask_s / timer.calls * 1e6)
                advance_us.append(timer.advance_s / timer.calls * 1e6)
    med = {k: statistics.median(v) for k, v in rates.items()}
    out = {"model": model.name, "threads": args.threads, "isa": _core.active_isa(),
           "rounds": args.rounds, "tokens": {k: statistics.median(v) for k, v in counts.items()},
           "free_tok_s": round(med["free"], 2), "schema_tok_s": round(med["schema"], 2),
           "ratio": round(med["schema"] / med["free"], 3),
           "mask_us_per_token": round(statistics.median(mask_us), 1),
           "advance_us_per_token": round(statistics.median(advance_us), 1)}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{model.name}, {args.threads} threads, {args.rounds} rounds alternating, medians (ISA: {out['isa']})")
    print("| decode | tokens | tokens/s | vs unconstrained | mask / token | advance / token |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| unconstrained | {out['tokens']['free']:.0f} | {out['free_tok_s']:.1f} | 1.00x | - | - |")
    print(f"| JSON schema | {out['tokens']['schema']:.0f} | {out['schema_tok_s']:.1f} | {out['ratio']:.2f}x | "
          f"{out['mask_us_per_token']:.0f} us | {out['advance_us_per_token']:.0f} us |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
