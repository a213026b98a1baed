"""``ctx restore REF [--as NAME]``: restore a snapshot onto the model, verifying it.

Checks that the snapshot was made by the loaded model's weights, reads and
verifies every page and rebuilds the context. ``--as NAME`` then makes it
the context NAME (a ref to that snapshot), e.g. to bring back an old state
from ``ctx log`` or an id from ``ctx import``.
"""
from __future__ import annotations

import argparse
import sys

from . import add_common_arguments, check_name, load_model, open_store


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("ref", help="a context, ref or snapshot id (a unique prefix of 8+ hex digits will do)")
    p.add_argument("--as", dest="as_name", default=None, metavar="NAME", help="make it the context NAME")
    p.add_argument("--force", action="store_true", help="move NAME even if it exists")
    p.add_argument("--text", action="store_true", help="print the context's text")


def main(args: argparse.Namespace) -> int:
    from ...errors import StoreError

    if args.as_name is not None:
        check_name(args.as_name)
    with open_store(args) as store:
        sid = store.resolve(args.ref)
        current = store.refs().get(args.as_name) if args.as_name is not None else None
        if args.as_name is not None and not args.force:
            if current is not None and current != sid:
                raise StoreError(f"'{args.as_name}' already exists (use --force to move it to {sid[:12]})")
        model = load_model(args)
        ctx = model.restore(store, sid)
        if args.as_name is not None:  # without --force, only where NAME still is what was checked above
            store.set_ref(args.as_name, sid, **({} if args.force else {"expect": current}))
        where = f" as {args.as_name}" if args.as_name else ""
        print(f"restored {args.ref}{where}: {ctx.n_tokens} tokens, snapshot {sid[:12]}, "
              f"weights {model.weight_id[:12]} ({model.name}), every page verified", file=sys.stderr)
        if args.text:
            print(ctx.text)
    return 0
