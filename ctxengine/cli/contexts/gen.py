"""``ctx gen NAME [-n N]``: generate from a stored context, streaming, and keep the result.

With no ``--seed`` the sampler's RNG continues from the context's last
generation (stored in its snapshot), so ``ctx gen`` twice draws what one
longer generation would have. Likewise a grammar (``--grammar-file``,
``--json-schema``) that a generation left unfinished goes on in the next
``ctx gen`` without flags; a JSON one is closed within ``-n`` tokens where it
fits unless ``--no-close-json`` says to leave it open.
"""
from __future__ import annotations

import argparse
import sys

from ..common import (add_grammar_arguments, add_sampling_arguments, grammar_options, require_stdout,
                      sampling_options)
from . import add_common_arguments, load_model, open_context, open_store, save


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("name", help="the context")
    add_sampling_arguments(p, max_tokens=128, seed_help="restart the RNG (default: continue it)")
    add_grammar_arguments(p)
    p.add_argument("--no-close-json", dest="close_json", action="store_false",
                   help="under a JSON grammar, cut the output where -n falls instead of closing it within "
                        "-n tokens (the default), for the next ctx gen to continue it")


def main(args: argparse.Namespace) -> int:
    from ...errors import ContextError

    require_stdout()
    # Refused before the context is restored, so that a refusal writes nothing to the store.
    sampling = {**checked_sampling(args), **grammar_options(args)}
    with open_store(args) as store:
        model = load_model(args)
        ctx = open_context(model, store, args.name)
        if args.max_tokens and ctx.n_tokens >= (n_ctx := model.config.n_ctx):
            raise ContextError(f"context '{args.name}' would hold at least {ctx.n_tokens + 1} tokens; "
                               f"the model's context length is {n_ctx}")
        n_before, finished = ctx.n_tokens, False
        try:
            for piece in ctx.generate(args.max_tokens, stop=args.stop, close_json=args.close_json, **sampling):
                sys.stdout.write(piece.text)
                sys.stdout.flush()
            finished = True
            sys.stdout.write("\n")
        except KeyboardInterrupt:
            sys.stdout.write("\n")  # end the text's line before save's report on stderr
            raise
        finally:
            # Keep what was generated even when the stream was cut short (Ctrl-C, the output failing):
            # it is saved before main reports why. A generation refused before its first token has
            # nothing to keep.
            if finished or ctx.n_tokens > n_before:
                save(ctx, store, args.name)
    return 0


def checked_sampling(args: argparse.Namespace) -> dict:
    """The sampling options, refused as the sampler would refuse them (``ctx run``'s settings)."""
    from ...api.options import Sampling

    Sampling(stop=args.stop, params=sampling_options(args)).checked()
    return sampling_options(args)
