"""``ctx models [list | verify]``: the models we know, and their weight ids."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("list", help="known names and where they resolve")
    v = sub.add_parser("verify", help="recompute weight ids and compare with the cache")
    v.add_argument("models", nargs="*", help="paths or names (default: the packaged model)")


def main(args: argparse.Namespace) -> int:
    from ..engine.registry import known_models, resolve_model
    from ..engine.weights import verify_weight_id
    from ..errors import CtxError

    if args.action in (None, "list"):
        for name, where in known_models().items():
            print(f"{name:<16} {where}")
        return 0
    status = 0
    for spec in args.models or [None]:
        path = resolve_model(spec)
        cached, actual = verify_weight_id(path)
        if cached is None:
            verdict = "computed (was not cached)"
        elif cached == actual:
            verdict = "ok (matches cache)"
        else:
            verdict = f"MISMATCH: cache had {cached}"
            status = 1
        print(f"{path}\n  weight_id {actual}  {verdict}")
    if status:
        raise CtxError("a cached weight id did not match the file (the cache entry is now corrected)")
    return status
