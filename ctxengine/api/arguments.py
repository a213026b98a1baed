"""``ctx serve``'s HTTP options, and their defaults."""
from __future__ import annotations

import argparse
import math

DEFAULT_MAX_BODY = 16 << 20        # bytes of a request body
DEFAULT_SHUTDOWN_TIMEOUT = 10.0    # seconds streams may go on after SIGTERM
DEFAULT_HEADER_TIMEOUT = 30.0      # seconds a connection has to send a request's head


def add_http_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", default=None, help="require this key on every HTTP route but /health "
                   "and the studio's page files (Authorization: Bearer KEY, or x-api-key: KEY)")
    p.add_argument("--ollama-models", action="append", default=[], metavar="DIR",
                   help="an Ollama model store to serve from (repeatable; default: $OLLAMA_MODELS, else "
                        "~/.ollama/models and /usr/share/ollama/.ollama/models, then ctx's own store, those that "
                        "exist). Ollama's /api/pull writes into the first one given and /api/delete removes from "
                        "it (default: ctx's own store, where `ctx pull ollama://` writes); the others are only read")
    p.add_argument("--no-ollama", action="store_true", help="do not look for Ollama's model store")
    # default None: the prefix cache's own (importing it here would load the engine to parse arguments)
    p.add_argument("--prefix-cache", type=count, default=None, metavar="N",
                   help="recent requests kept per model for prefix reuse (default 32; 0: off)")
    p.add_argument("--max-body", type=_size, default=DEFAULT_MAX_BODY, metavar="BYTES",
                   help=f"largest request body accepted (default {DEFAULT_MAX_BODY}; larger: 413)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browsers from this origin ('*': any; repeatable; default: no CORS)")
    p.add_argument("--request-timeout", type=_positive, default=None, metavar="S",
                   help="stop any HTTP generation after this many seconds; its reply ends cut short, as at "
                        "max_tokens (default: no limit)")
    p.add_argument("--header-timeout", type=_positive, default=DEFAULT_HEADER_TIMEOUT, metavar="S",
                   help="close a connection that has not sent a whole request line and headers this many "
                        f"seconds after it opened or began them (default {DEFAULT_HEADER_TIMEOUT:g})")
    p.add_argument("--shutdown-timeout", type=_seconds, default=DEFAULT_SHUTDOWN_TIMEOUT, metavar="S",
                   help=f"on SIGTERM, let streams finish for this long, then cancel them "
                        f"(default {DEFAULT_SHUTDOWN_TIMEOUT:g})")


def _positive(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:  # False for NaN too
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def _seconds(text: str) -> float:  # 0: cancel at once; NaN or -1 were taken, and broke the shutdown
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def count(text: str) -> int:
    """A number of things, 0 or more (argparse names the option when this raises): a server
    started with --prefix-cache -1 failed every request; ``ctx gen -n -5`` wrote a snapshot."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {n}")
    return n


def _size(text: str) -> int:  # --max-body 0 or less: every request a 413
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a number of bytes > 0, not {n}")
    return n
