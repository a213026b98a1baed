"""``ctx store stats``: pages, bytes stored against logical, dedup and compression."""
from __future__ import annotations

import argparse
import dataclasses

from ..contexts import add_common_arguments, open_store, print_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("stats", help="pages, bytes stored vs logical, dedup ratio")
    add_common_arguments(s)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(verb_parser=s)  # its errors name it: `ctx store stats: error: ...`


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def main(args: argparse.Namespace) -> int:
    with open_store(args, existing=True) as store:
        st = store.stats()
        path = store.path
    if args.json:
        print_json({"path": str(path), **dataclasses.asdict(st)})
        return 0
    print(f"store        {path}")
    print(f"snapshots    {st.n_manifests}  (refs: {st.n_refs})")
    print(f"pages        {st.n_pages}")
    print(f"logical      {human_bytes(st.logical_bytes)}  (every snapshot's pages, shared ones counted each time)")
    print(f"unique       {human_bytes(st.unique_raw_bytes)}  (dedup ratio {st.dedup_ratio:.2f}x)")
    print(f"stored       {human_bytes(st.stored_bytes)}  (compression {st.compression_ratio:.2f}x)")
    print(f"file         {human_bytes(st.file_bytes)}")
    return 0
