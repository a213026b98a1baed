"""``ctx gc``: remove snapshots no ref reaches and pages no kept snapshot names."""
from __future__ import annotations

import argparse

from ..contexts import add_common_arguments, open_store, progress_bar
from .stats import human_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="keep pages a transfer wrote this recently without a manifest yet (default 3600)")
    p.add_argument("--fleet", metavar="redis://HOST:PORT[,...]", default=None,
                   help="collect the fleet's Redis Cluster instead of the local store (same roots and grace)")


def main(args: argparse.Namespace) -> int:
    extra = {} if args.grace is None else {"grace": args.grace}
    if args.fleet is not None:
        from ...store.fleet import Fleet

        with open_store(args) as store:
            fleet = Fleet(args.fleet, store)
            try:
                r = fleet.gc(**extra)
            finally:
                fleet.close()
    else:
        with open_store(args) as store, progress_bar("gc", unit="item") as progress:
            r = store.gc(progress, **extra)
    print(f"removed {r.manifests_removed} snapshots and {r.pages_removed} pages "
          f"({human_bytes(r.bytes_freed)}); kept {r.manifests_kept} snapshots and {r.pages_kept} pages")
    return 0
