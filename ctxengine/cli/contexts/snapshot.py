"""``ctx snapshot NAME [--tag TAG] [--label K=V]``: print, tag or label a context's snapshot.

Offline a context is always snapshotted (every verb that changes it stores
it), so this prints its snapshot id. ``--tag`` points another ref at it (a
checkpoint that later changes to NAME leave alone); ``--label`` restores the
context (verifying it) and stores a new snapshot carrying the labels.
"""
from __future__ import annotations

import argparse

from ...errors import CtxError
from ...store.manifest import new_labels
from . import add_common_arguments, check_name, load_model, open_context, open_store, require_absent, save


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("name", help="the context")
    p.add_argument("--tag", default=None, help="also point this new ref at the snapshot")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="add a label (repeatable)")


def main(args: argparse.Namespace) -> int:
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CtxError(f"a label is KEY=VALUE, got {item!r}")
        labels[key] = value
    if args.tag is not None:
        check_name(args.tag, "ref")
    with open_store(args) as store:
        if args.tag is not None:
            require_absent(store, args.tag)
        if labels:
            ctx = open_context(load_model(args), store, args.name)
            ctx.labels.update(new_labels(labels))
            sid = save(ctx, store, args.name)
        else:
            check_name(args.name, "ref")  # only read: a server's ref may be tagged
            sid = store.resolve(args.name)
        if args.tag is not None:
            store.set_ref(args.tag, sid, expect=None)  # made meanwhile by another process: refused
        print(sid)
    return 0
