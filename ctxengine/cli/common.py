"""Options and helpers shared by the verbs."""
from __future__ import annotations

import argparse


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="a .gguf path or a known name (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")


def load_model(args: argparse.Namespace):
    from ..model import load

    return load(args.model, threads=args.threads)
