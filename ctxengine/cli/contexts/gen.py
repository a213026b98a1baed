"""``ctx gen NAME [-n N]``: generate from a stored context, streaming, and keep the result.

With no ``--seed`` the sampler's RNG continues from the context's last
generation (stored in its snapshot), so ``ctx gen`` twice draws what one
longer generation would have. Likewise a grammar (``--grammar-file``,
``--json-schema``) that a generation left unfinished goes on in the next
``ctx gen`` without flags.
"""
from __future__ import annotations

import argparse
import sys

from ..common import add_grammar_arguments, add_sampling_arguments, grammar_options, sampling_options
from . import add_common_arguments, load_model, open_context, open_store, save


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("name", help="the context")
    add_sampling_arguments(p, max_tokens=128, seed_help="restart the RNG (default: continue it)")
    add_grammar_arguments(p)


def main(args: argparse.Namespace) -> int:
    sampling = {**sampling_options(args), **grammar_options(args)}
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
