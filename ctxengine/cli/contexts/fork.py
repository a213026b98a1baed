"""``ctx fork SRC DST``: a new context continuing from SRC's snapshot.

Offline this is only a new ref to the same snapshot: nothing is copied, and
DST's first snapshot will name SRC's as its parent.
"""
from __future__ import annotations

import argparse
import sys

from . import add_common_arguments, check_name, open_store, require_absent


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("src", help="a context, ref or snapshot id")
    p.add_argument("dst", help="the new context's name")


def main(args: argparse.Namespace) -> int:
    check_name(args.dst)
    with open_store(args) as store:
        sid = store.resolve(args.src)
        require_absent(store, args.dst)
        store.set_ref(args.dst, sid, expect=None)  # made meanwhile by another process: refused, not replaced
        print(f"{args.dst}: forked from {args.src} at snapshot {sid[:12]}", file=sys.stderr)
    return 0
