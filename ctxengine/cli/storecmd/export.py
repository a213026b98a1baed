"""``ctx export REF FILE``: write a snapshot and its pages to one self-checking file."""
from __future__ import annotations

import argparse
import os

from ..contexts import add_common_arguments, open_store, progress_bar
from .stats import human_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("ref", help="a context, ref or snapshot id")
    p.add_argument("file", help="the file to write (written whole or not at all)")


def main(args: argparse.Namespace) -> int:
    with open_store(args, existing=True) as store, progress_bar("export") as progress:
        sid = store.resolve(args.ref)
        store.export(sid, args.file, progress)
    print(f"exported {args.ref} (snapshot {sid[:12]}) to {args.file}, {human_bytes(os.path.getsize(args.file))}")
    return 0
