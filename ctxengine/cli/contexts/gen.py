"""``ctx gen NAME [-n N]``: generate from a stored context, streaming, and keep the result.

With no ``--seed`` the sampler's RNG continues from the context's last
generation (stored in its snapshot), so ``ctx gen`` twice draws what one
longer generation would have.
"""
from __future__ import annotations

import argparse
import sys

from . import add_common_arguments, load_model, open_context, open_store, save


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("name", help="the context")
    p.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None, help="restart the RNG (default: continue it)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def main(args: argparse.Namespace) -> int:
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                    repeat_penalty=args.repeat_penalty, seed=args.seed)
    with open_store(args) as store:
        model = load_model(args)
        ctx = open_context(model, store, args.name)
        try:
            for piece in ctx.generate(args.max_tokens, stop=args.stop, **sampling):
                sys.stdout.write(piece.text)
                sys.stdout.flush()
        finally:
            # Keep what was generated even if the stream was interrupted.
            sys.stdout.write("\n")
            save(ctx, store, args.name)
    return 0
