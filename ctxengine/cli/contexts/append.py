"""``ctx append NAME TEXT``: add text to a stored context (restore, append, snapshot)."""
from __future__ import annotations

import argparse

from ..common import as_text, read_stdin
from . import add_common_arguments, chat_turn, load_model, open_context, open_store, save


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("name", help="the context")
    p.add_argument("text", help="text to append ('-' reads standard input)")
    p.add_argument("--role", choices=("user", "assistant", "system"), default=None,
                   help="append the text as a chat message of this role (a user message also "
                        "opens the assistant's turn, ready for ctx gen)")
    p.add_argument("--special", action="store_true", help="parse control tokens like <|im_start|> in TEXT")


def main(args: argparse.Namespace) -> int:
    text = read_stdin("the text") if args.text == "-" else as_text(args.text)
    with open_store(args) as store:
        model = load_model(args)
        ctx = open_context(model, store, args.name)
        if args.role:
            ctx.append(chat_turn(model, ctx, args.role, text), parse_special=True)
        else:
            ctx.append(text, parse_special=args.special)
        save(ctx, store, args.name)
    return 0
