"""``ctx ls``: the contexts (refs) in the store."""
from __future__ import annotations

import argparse

from . import EVICTED_PREFIX, RESPONSES_PREFIX, add_common_arguments, describe, open_store, print_json, when


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("--all", action="store_true",
                   help="also show refs kept for evicted live contexts and stored Responses API responses")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:
    with open_store(args, existing=True) as store:
        rows = [dict(name=name, **describe(store, sid)) for name, sid in sorted(store.refs().items())
                if args.all or not name.startswith((EVICTED_PREFIX, RESPONSES_PREFIX))]
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        return 0
    width = max(4, *(len(r["name"]) for r in rows))
    print(f"{'NAME':<{width}}  SNAPSHOT      TOKENS  CREATED              MODEL")
    for r in rows:
        labels = " ".join(f"{k}={v}" for k, v in sorted(r["labels"].items()))
        print(f"{r['name']:<{width}}  {r['snapshot'][:12]}  {r['tokens']:>6}  {when(r['created'])}  "
              f"{r['model']}{'  ' + labels if labels else ''}")
    return 0
