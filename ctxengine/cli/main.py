"""``ctx <verb>``: a thin dispatcher; each verb lives in ctxengine.cli.<verb>.

Errors a user can act on (CtxError) print as one line, never a traceback; so
does a standard output that cannot be written (a full disk), while a reader
that has gone (``ctx ls | head``) ends the command quietly.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# verb -> (module, one-line help)
VERBS = {
    "run": ("run", "generate from a prompt, streaming (chat template applied for instruct models)"),
    "tokenize": ("tokenize", "print the token ids of a text"),
    "models": ("models", "list known models, verify weight ids"),
    "pull": ("pull", "fetch a model (hf://ORG/REPO:QUANT, ollama://NAME:TAG, a packaged name), "
                     "or a snapshot from another host"),
    "bench": ("bench", "prefill, decode and batched decode speed (side by side with llama.cpp when importable)"),
    "serve": ("serve", "serve models over HTTP (OpenAI, Anthropic, Ollama) and gRPC (contexts, snapshots)"),
    "verify": ("verify", "prove bit-identical results across threads, chunking, batching, forks, restores, SIMD"),
    # contexts, offline: a named context is its ref in the snapshot store
    "new": ("contexts.new", "create a named context (optionally with a system message)"),
    "append": ("contexts.append", "append text to a context"),
    "gen": ("contexts.gen", "generate from a context, streaming, and keep the result"),
    "fork": ("contexts.fork", "branch a context (copies nothing)"),
    "snapshot": ("contexts.snapshot", "print, tag or label a context's snapshot"),
    "restore": ("contexts.restore", "restore a snapshot onto the model, verifying weights and pages"),
    "ls": ("contexts.ls", "list the contexts in the store"),
    "log": ("contexts.log", "where a context's ref has pointed, newest first"),
    "rm": ("contexts.rm", "remove contexts (their pages go at the next gc)"),
    # the snapshot store
    "gc": ("storecmd.gc", "remove unreachable snapshots and pages"),
    "export": ("storecmd.export", "write a snapshot to a portable, self-checking file"),
    "import": ("storecmd.importfile", "verify and store a snapshot file"),
    "push": ("push", "send a snapshot to another host's ctx serve (only the pages it lacks)"),
    "store": ("storecmd.stats", "snapshot store information (ctx store stats)"),
}


class Parser(argparse.ArgumentParser):
    """Its usage errors are one line too, naming where the usage is (each verb's parser is one)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """ctx's parser, with the arguments of the verb argv names (its first word that is not
    an option: ctx's own options take no value). Only that verb's module is imported: each
    imports what its commands need (a pull its HTTP client, serve the web stack), and a
    command should not pay for all of them before it starts."""
    parser = Parser(prog="ctx", description="ctx-engine: contexts as objects, for GGUF models")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for verb, (module, help_text) in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        if verb == chosen:
            mod = importlib.import_module(f"ctxengine.cli.{module}")
            mod.add_arguments(p)
            p.set_defaults(func=mod.main, verb_parser=p)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments; one the verb does not take is its usage error (``ctx serve: error:``), not ctx's."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        before_verb = argv[:argv.index(args.verb)] if args.verb in argv else []
        (parser if extra[0] in before_verb else args.verb_parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    from ..errors import CtxError
    from .common import UsageError

    args = parse_args(argv)
    out = _Stdout(sys.stdout) if sys.stdout is not None else None  # None: run with it closed (>&-)
    sys.stdout = out
    try:
        code = int(args.func(args) or 0)
        if out is not None:
            out.flush()  # here, where a failure is ours to report, not the interpreter's at exit
        return code
    except UsageError as err:
        args.verb_parser.error(str(err))
    except CtxError as err:
        print(f"{args.verb_parser.prog}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{args.verb_parser.prog}: error: out of memory (what it was asked to read or make does not fit in "
              "this process's memory)", file=sys.stderr)
        return 1
    except OSError as err:
        if out is not None and err is out.failed:
            out.drop()
            if isinstance(err, BrokenPipeError):
                return 0  # the reader has all it wanted (ctx ls | head)
            print(f"{args.verb_parser.prog}: error: cannot write to standard output: {err.strerror or err}",
                  file=sys.stderr)
            return 1
        if isinstance(err, BrokenPipeError):
            return 0
        raise
    finally:
        if out is not None:
            sys.stdout = out.stream


class _Stdout:
    """sys.stdout while a verb runs, noting the error of a write it could not make (a full disk,
    a reader gone), so that main can tell that error from any other OSError."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.failed: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as err:
            self.failed = err
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as err:
            self.failed = err
            raise

    def drop(self) -> None:
        """Send what is still buffered to /dev/null: flushed at exit it would fail again, as a
        second error after ours (Python's own advice for a reader gone: the signal module's docs)."""
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing flushes at exit
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _version() -> str:
    from ..version import __version__

    return f"ctx {__version__}"


if __name__ == "__main__":
    sys.exit(main())
