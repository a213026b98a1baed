"""``ctx run [-m MODEL] [PROMPT]``: stream a reply to a prompt.

Instruct models get their chat template applied (``--raw`` sends the prompt
as it is). With no prompt: reads it from standard input, or on a terminal
starts an interactive chat that keeps one context across turns.

A model from Ollama's store runs as ``ctx serve`` serves it: its TEMPLATE
layer renders the chat (else the GGUF's own template), its SYSTEM layer is
the system message unless ``--system`` gives one, and its params layer sets
the sampling options (and num_ctx) the command line does not
(serving/prompts.py, api/options.py: the same calls).
"""
from __future__ import annotations

import argparse
import sys

from .common import (SAMPLING_DEFAULTS, add_grammar_arguments, add_hf_argument, add_model_arguments,
                     add_sampling_arguments, as_text, grammar_options, load_model, read_stdin, require_stdout,
                     sampling_options, source_entry)

DEFAULT_MAX_TOKENS = 256


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_hf_argument(p)
    p.add_argument("prompt", nargs="?", help="the prompt (default: standard input, or a chat on a terminal)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--system", default=None,
                   help="system message (chat template only; default: an Ollama model's SYSTEM layer)")
    add_sampling_arguments(p, max_tokens=DEFAULT_MAX_TOKENS, seed_help="RNG seed (default: random)", layered=True)
    add_grammar_arguments(p)
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH[:SCALE]",
                   help="run with this LoRA adapter file at SCALE (default 1; repeatable)")


def entry_defaults(entry):
    """The sampling defaults an entry's params layer sets (``ctx serve``'s entry_sampling)."""
    from ..api.errors import ApiError
    from ..api.options import Sampling, entry_sampling
    from ..errors import CtxError

    if entry is None:
        return Sampling()
    try:
        return entry_sampling(entry)
    except ApiError as err:
        raise CtxError(err.message) from None


def settings(args: argparse.Namespace, layer):
    """What the command line gives, else what the params layer does, else our defaults: merged
    as ``ctx serve`` merges a request's options over the layer (Sampling.over)."""
    from ..api.options import Sampling

    given = {name: value for name, value in sampling_options(args).items() if value is not None}
    asked = Sampling(max_tokens=args.max_tokens, stop=args.stop or None, params=given)
    ours = Sampling(max_tokens=DEFAULT_MAX_TOKENS, params=dict(SAMPLING_DEFAULTS))
    return asked.over(layer).over(ours).checked()


def main(args: argparse.Namespace) -> int:
    from ..engine.model_source import CatalogEntry
    from ..errors import CtxError, RequestError
    from ..serving.lora import LoraSpec
    from ..serving.prompts import chat_text

    require_stdout()
    constraint = grammar_options(args)
    specs = [LoraSpec.parse(text, need_file=True) for text in args.lora]
    entry = source_entry(args)  # an Ollama model's layers, or None
    layer = entry_defaults(entry)
    s = settings(args, layer)  # refused before the model loads
    piped = args.prompt is None and (sys.stdin is None or not sys.stdin.isatty())
    prompt = read_stdin("the prompt") if piped else as_text(args.prompt)  # None: a chat on the terminal
    if piped and not prompt.strip():
        raise CtxError('no prompt: give one as an argument (ctx run "...") or on standard input')
    model = load_model(args, n_ctx=layer.num_ctx)
    entry = entry or CatalogEntry(model.name, model.path, "file")
    for spec in specs:
        model.load_lora(spec.name, spec.path)
    use_template = not args.raw and (bool(entry.template) or model.chat_template is not None)
    if not args.raw and not use_template:
        print(f"ctx run: warning: {model.name} has no chat template: the prompt goes to the model as it is "
              "(as with --raw)", file=sys.stderr, flush=True)
    try:
        ctx = model.context("run", lora={spec.name: spec.scale for spec in specs})
    except RequestError as err:  # two names for one adapter file
        raise CtxError(f"--lora: {err}") from None
    messages = [{"role": "system", "content": as_text(args.system)}] if args.system and use_template else []

    def turn(user_text: str) -> None:
        if use_template:
            # Render the whole conversation and append only what is new: the
            # context already holds the earlier turns' KV.
            messages.append({"role": "user", "content": user_text})
            prompt = chat_text(model, entry, messages)
            seen = model.detokenize(ctx.tokens)
            new_text = prompt[len(seen):] if prompt.startswith(seen) else prompt
            if not prompt.startswith(seen):
                ctx.rewind(ctx.n_tokens)
            ctx.append(new_text, parse_special=True)
        else:
            ctx.append(user_text)
        reply = []
        for piece in ctx.generate(s.max_tokens, stop=s.stop, **constraint, **s.params):
            reply.append(piece.text)
            sys.stdout.write(piece.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        if use_template:
            messages.append({"role": "assistant", "content": "".join(reply)})

    if prompt is not None:
        turn(prompt)
    else:
        print(f"{model.name} — chat; an empty line or Ctrl-D ends it.", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            turn(as_text(line))
    return 0
