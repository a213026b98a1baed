"""Options and helpers shared by the verbs."""
from __future__ import annotations

import argparse

# ctxengine.engine.engine.KV_DTYPES, repeated so that parsing arguments does not import the native core.
KV_DTYPES = ("f16", "q8", "vq8")
MAX_THREADS = 512  # ctxengine.engine.engine.MAX_THREADS, likewise


def thread_count(text: str) -> int | None:
    """``-t``'s value: 1 to MAX_THREADS, or 0 for one a core (argparse names the option when this raises)."""
    n = int(text)
    if not 0 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_THREADS} (0: one a core), not {n}")
    return n or None


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="a .gguf path or a known name (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("-t", "--threads", type=thread_count, default=None, help="threads (default: physical cores)")
    p.add_argument("--kv", choices=KV_DTYPES, default="f16",
                   help="KV cache dtype: f16 (default), q8 (K and V 8-bit, ~1.9x the tokens per GiB), "
                        "vq8 (V 8-bit); a context restores only into a model loaded with its dtype")


def add_hf_argument(p: argparse.ArgumentParser, *, repeatable: bool = False) -> None:
    """``-hf ORG/REPO[:QUANT]``, as llama.cpp spells it: pulled first unless cached (docs/pull.md)."""
    p.add_argument("-hf", "--hf-repo", dest="hf", metavar="ORG/REPO[:QUANT]", action="append" if repeatable else "store",
                   default=[] if repeatable else None,
                   help="a GGUF model from the Hugging Face Hub, pulled into its cache first when not there"
                        + (" (repeatable)" if repeatable else ""))


def hf_model(spec: str) -> str:
    """Pull ``-hf``'s model when the cache lacks it; the name it is served and loaded by."""
    from ..engine.hf_pull import pull_hf

    return pull_hf(spec).spec.name


def load_model(args: argparse.Namespace, *, threads: int | None = None):
    """The model the arguments name (``-hf`` before ``-m``); ``threads`` overrides ``--threads``."""
    from ..state.model import load

    spec = hf_model(args.hf) if getattr(args, "hf", None) else args.model
    return load(spec, threads=threads or args.threads, kv=args.kv)


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


def add_grammar_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--grammar-file", metavar="F.gbnf", default=None,
                   help="constrain the output to a GBNF grammar (as llama.cpp's grammars/ write it)")
    g.add_argument("--json-schema", metavar="F.json", default=None,
                   help="constrain the output to JSON valid against this JSON Schema")


def grammar_options(args: argparse.Namespace) -> dict:
    """``grammar=`` for Context.generate from --grammar-file / --json-schema (empty: neither)."""
    path = args.grammar_file or args.json_schema
    if path is None:
        return {}
    from ..text.grammar import Grammar
    from ..errors import CtxError

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise CtxError(f"cannot read {path}: {err}") from None
    grammar = Grammar.gbnf(text) if args.grammar_file else Grammar.json_schema(text)
    grammar.compiled()  # a bad file is refused before the model loads
    return {"grammar": grammar}


def sampling_options(args: argparse.Namespace) -> dict:
    """The SamplerParams fields the sampling arguments set."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, seed=args.seed)
