"""``ctx rm NAME...``: remove contexts (refs); their pages go at the next ``ctx gc``."""
from __future__ import annotations

import argparse
import sys

from ...errors import StoreError
from . import add_common_arguments, check_name, open_store


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("names", nargs="+", metavar="NAME", help="contexts or refs to remove")


def main(args: argparse.Namespace) -> int:
    for name in args.names:
        check_name(name, "ref")
    with open_store(args, existing=True) as store:
        known = store.refs()
        absent = [n for n in args.names if n not in known]
        if absent:  # remove all or nothing
            raise StoreError(f"no context or ref named '{absent[0]}'")
        for name in args.names:
            store.delete_ref(name)
            print(f"removed {name} (ctx gc frees what nothing else uses)", file=sys.stderr)
    return 0
