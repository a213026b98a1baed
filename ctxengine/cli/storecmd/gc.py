"""``ctx gc``: remove snapshots no ref reaches and pages no kept snapshot names.

First it drops the refs a process that died kept for its evicted contexts
(state/evicted.py): nothing can read those back, and they would pin their pages.
"""
from __future__ import annotations

import argparse
import sys

from ..contexts import add_common_arguments, open_store, progress_bar
from .stats import human_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="keep pages a transfer wrote this recently without a manifest yet (default 3600)")
    p.add_argument("--fleet", metavar="redis://HOST:PORT[,...]", default=None,
                   help="collect the fleet's Redis Cluster instead of the local store (same roots and grace)")


def main(args: argparse.Namespace) -> int:
    from ...state.evicted import drop_orphaned_refs

    extra = {} if args.grace is None else {"grace": args.grace}
    with open_store(args) as store:
        # Refs a dead process kept for the contexts it had evicted: nothing will ever read them back.
        orphans = drop_orphaned_refs(store)
        if orphans:
            print(f"dropped {len(orphans)} refs of evicted contexts whose process is gone", file=sys.stderr)
        if args.fleet is not None:
            from ...store.fleet import Fleet

            fleet = Fleet(args.fleet, store)
            try:
                r = fleet.gc(**extra)
            finally:
                fleet.close()
        else:
            with progress_bar("gc", unit="item") as progress:
                r = store.gc(progress, **extra)
    print(f"removed {r.manifests_removed} snapshots and {r.pages_removed} pages "
          f"({human_bytes(r.bytes_freed)}); kept {r.manifests_kept} snapshots and {r.pages_kept} pages")
    return 0
