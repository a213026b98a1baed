"""``ctx log REF``: where a ref has pointed, newest first (like git reflog)."""
from __future__ import annotations

import argparse

import sys

from ...errors import CorruptDataError, StoreError
from . import add_common_arguments, check_name, describe, open_store, print_json, when


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("ref", help="a context or ref")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:
    check_name(args.ref, "ref")
    with open_store(args, existing=True) as store:
        rows = []
        for entry in reversed(store.ref_log(args.ref)):
            row = {"time": entry.time, "old": entry.old, "new": entry.new, "tokens": None, "damaged": None}
            try:
                row["tokens"] = describe(store, entry.new)["tokens"]
            except CorruptDataError as err:  # there, but its bytes fail their check: not collected
                row["damaged"] = str(err)
            except StoreError:
                pass  # collected by gc: the log outlives the snapshots it names
            rows.append(row)
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            tokens = f"{r['tokens']:>6} tokens" if r["tokens"] is not None else \
                ("   (damaged)" if r["damaged"] else "  (collected)")
            action = "created" if r["old"] is None else f"from {r['old'][:12]}"
            print(f"{r['new'][:12]}  {when(r['time'])}  {tokens}  {action}")
    for r in rows:
        if r["damaged"]:
            print(f"ctx log: snapshot {r['new']} is damaged: {r['damaged']}", file=sys.stderr)
    return 1 if any(r["damaged"] for r in rows) else 0
