"""``ctx new NAME [--system TEXT]``: create a named context in the store."""
from __future__ import annotations

import argparse

from ...errors import RequestError
from . import add_common_arguments, check_name, load_model, no_system_turn, open_store, require_absent, save


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("name", help="the new context's name (its ref in the store)")
    p.add_argument("--system", default=None,
                   help="system message (rendered with the model's chat template; plain text without one). "
                        "A template without a system turn (Gemma 3's) would drop it, so it is refused there: "
                        "put it at the start of the first user message instead")


def main(args: argparse.Namespace) -> int:
    check_name(args.name)
    with open_store(args) as store:
        require_absent(store, args.name)
        model = load_model(args)
        ctx = model.context(args.name)
        if args.system:
            try:
                ctx.append_system(args.system)
            except RequestError:
                raise no_system_turn(model, ctx, "--system") from None
        save(ctx, store, args.name)
    return 0
