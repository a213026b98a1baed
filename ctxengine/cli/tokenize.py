"""``ctx tokenize [-m MODEL] TEXT``: token ids of a text (no BOS, specials as text, unless asked)."""
from __future__ import annotations

import argparse
import json

from .common import add_model_arguments, as_text, read_stdin


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("text", nargs="?", help="the text (default: standard input)")
    p.add_argument("--bos", action="store_true", help="prepend BOS where the model uses one")
    p.add_argument("--special", action="store_true", help="parse control tokens like <|im_start|>")
    p.add_argument("--pieces", action="store_true", help="print one id and its text per line")


def main(args: argparse.Namespace) -> int:
    # The tokenizer needs only the file's metadata: no weights are loaded.
    from ..engine.gguf_file import open_gguf
    from ..engine.registry import resolve_model
    from ..text.tokenizer import Tokenizer

    text = as_text(args.text) if args.text is not None else read_stdin("the text")
    with open_gguf(resolve_model(args.model)) as f:
        tok = Tokenizer.from_file(f)
    ids = tok.encode(text, add_bos=args.bos and tok.add_bos, parse_special=args.special)
    if args.pieces:
        for i in ids:
            print(f"{i:>8}  {tok.token_bytes(i)!r}")
    else:
        print(json.dumps(ids))
    return 0
