"""``ctx run [-m MODEL] [PROMPT]``: stream a reply to a prompt.

Instruct models get their chat template applied (``--raw`` sends the prompt
as it is). With no prompt: reads it from standard input, or on a terminal
starts an interactive chat that keeps one context across turns.
"""
from __future__ import annotations

import argparse
import sys

from .common import (add_grammar_arguments, add_hf_argument, add_model_arguments, add_sampling_arguments,
                     grammar_options, load_model, sampling_options)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_hf_argument(p)
    p.add_argument("prompt", nargs="?", help="the prompt (default: standard input, or a chat on a terminal)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--system", default=None, help="system message (chat template only)")
    add_sampling_arguments(p, max_tokens=256, seed_help="RNG seed (default: random)")
    add_grammar_arguments(p)
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH[:SCALE]",
                   help="run with this LoRA adapter file at SCALE (default 1; repeatable)")


def main(args: argparse.Namespace) -> int:
    from ..errors import CtxError
    from ..serving.lora import LoraSpec

    constraint = grammar_options(args)
    specs = [LoraSpec.parse(text) for text in args.lora]
    model = load_model(args)
    for spec in specs:
        model.load_lora(spec.name, spec.path)
    use_template = not args.raw and model.chat_template is not None
    try:
        ctx = model.context("run", lora={spec.name: spec.scale for spec in specs})
    except ValueError as err:  # two names for one adapter file
        raise CtxError(f"--lora: {err}") from None
    sampling = sampling_options(args)
    messages = [{"role": "system", "content": args.system}] if args.system and use_template else []

    def turn(user_text: str) -> None:
        if use_template:
            # Render the whole conversation and append only what is new: the
            # context already holds the earlier turns' KV.
            messages.append({"role": "user", "content": user_text})
            prompt = model.chat_prompt(messages)
            seen = model.detokenize(ctx.tokens)
            new_text = prompt[len(seen):] if prompt.startswith(seen) else prompt
            if not prompt.startswith(seen):
                ctx.rewind(ctx.n_tokens)
            ctx.append(new_text, parse_special=True)
        else:
            ctx.append(user_text)
        reply = []
        for piece in ctx.generate(args.max_tokens, stop=args.stop, **constraint, **sampling):
            reply.append(piece.text)
            sys.stdout.write(piece.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        if use_template:
            messages.append({"role": "assistant", "content": "".join(reply)})

    if args.prompt is not None:
        turn(args.prompt)
    elif not sys.stdin.isatty():
        text = sys.stdin.read()
        if not text.strip():
            raise CtxError('no prompt: give one as an argument (ctx run "...") or on standard input')
        turn(text)
    else:
        print(f"{model.name} — chat; an empty line or Ctrl-D ends it.", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            turn(line)
    return 0
