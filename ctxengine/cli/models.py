"""``ctx models [list | verify]``: the models we know, and their weight ids."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="every model ctx serve would offer, and why any cannot be served")
    ls.add_argument("--models-dir", metavar="DIR", default=None, help="also list every .gguf file under DIR")
    ls.add_argument("--no-ollama", action="store_true", help="leave Ollama's model store out")
    v = sub.add_parser("verify", help="recompute weight ids and compare with the cache")
    v.add_argument("models", nargs="*", help="paths or names (default: the packaged model)")
    for action in (ls, v):
        action.set_defaults(verb_parser=action)  # its errors name it: `ctx models verify: error: ...`


def main(args: argparse.Namespace) -> int:
    from ..engine.registry import resolve_model
    from ..engine.weights import verify_weight_id
    from ..errors import CtxError

    if args.action in (None, "list"):
        return _list(getattr(args, "models_dir", None), getattr(args, "no_ollama", False))
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


def _list(models_dir: str | None, no_ollama: bool) -> int:
    """One line a model: name, where it comes from, and its file or why it cannot be served."""
    from ..serving.catalog import build_catalog, found_ollama_stores

    catalog = build_catalog(models_dir=models_dir, ollama=[] if no_ollama else found_ollama_stores())
    for e in catalog.entries():
        where = str(e.path) if e.servable else f"cannot be served: {e.error}"
        if e.servable and not e.path.is_file():
            where += "  (built from its installed package on first use, or by ctx pull)"
        print(f"{e.name:<24} {e.source:<10} {where}")
    return 0
