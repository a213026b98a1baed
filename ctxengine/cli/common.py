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


def add_sampling_arguments(p: argparse.ArgumentParser, *, max_tokens: int, seed_help: str) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=max_tokens,
                   help=f"tokens to generate at most (default {max_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None, help=seed_help)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_options(args: argparse.Namespace) -> dict:
    """The SamplerParams fields the sampling arguments set."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, seed=args.seed)
