"""Options and helpers shared by the verbs."""
from __future__ import annotations

import argparse
import sys

from ..api.arguments import count  # -n here, --prefix-cache there: one rule
from ..errors import CtxError


class UsageError(CtxError):
    """An argument the command cannot use as given, found only once the model or store is open:
    reported as argparse reports a usage error (one line, exit 2), by cli/main.py."""


# ctxengine.engine.engine.KV_DTYPES, repeated so that parsing arguments does not import the native core.
KV_DTYPES = ("f16", "q8", "vq8")
MAX_THREADS = 512  # ctxengine.engine.engine.MAX_THREADS, likewise
MAX_PORT = 65535
# The sampler settings the verbs start from (``ctx run``: where the model's params layer sets none).
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}


def thread_count(text: str) -> int | None:
    """``-t``'s value: 1 to MAX_THREADS, or 0 for one a core (argparse names the option when this raises)."""
    n = int(text)
    if not 0 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_THREADS} (0: one a core), not {n}")
    return n or None


def port_number(text: str) -> int:
    """A port option's value: 0 to MAX_PORT, 0 turning that face off (argparse names the option)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, not {text!r}") from None
    if not 0 <= n <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_PORT} (0: off), not {n}")
    return n


def read_stdin(what: str) -> str:
    """All of standard input, where ``what`` (the prompt, the text) was to come from: run with
    it closed (``<&-``), Python has no sys.stdin at all, which is the user's to hear of. Bytes
    that are not UTF-8 become U+FFFD, one each, as llama.cpp reads them (see as_text)."""
    if sys.stdin is None:
        from ..errors import CtxError

        raise CtxError(f"standard input is closed: give {what} as an argument")
    raw = getattr(sys.stdin, "buffer", None)
    return raw.read().decode("utf-8", "replace") if raw is not None else as_text(sys.stdin.read())


def as_text(value: str | None) -> str | None:
    """Text from the command line as the model should read it. Bytes of an argument that are
    not UTF-8 reach Python as lone surrogates (surrogateescape), which the tokenizer would
    write as 3 bytes each, neither the user's bytes nor what llama.cpp makes of them: each
    becomes U+FFFD, as llama.cpp's tokenizer reads such a byte."""
    if value is None:
        return None
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate no decoding made: not from argv or stdin
        return value


def require_stdout() -> None:
    """Refuse to generate text for a closed standard output (``>&-``), before any work is done."""
    if sys.stdout is None:
        from ..errors import CtxError

        raise CtxError("standard output is closed: the text would go nowhere (>/dev/null discards it)")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="a .gguf path or a known name (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("-t", "--threads", type=thread_count, default=None, help="threads (default: physical cores)")
    p.add_argument("--kv", choices=KV_DTYPES, default="f16",
                   help="KV cache dtype: f16 (default), q8 (K and V 8-bit, ~1.9x the tokens per GiB), "
                        "vq8 (V 8-bit); a context restores only into a model loaded with its dtype")


def add_hf_argument(p: argparse.ArgumentParser, *, repeatable: bool = False) -> None:
    """``-hf ORG/REPO[:QUANT]``, as llama.cpp spells it: pulled first unless cached (docs/pull.md)."""
    p.add_argument("-hf", "--hf-repo", dest="hf", metavar="ORG/REPO[:QUANT]",
                   action="append" if repeatable else "store",
                   default=[] if repeatable else None,
                   help="a GGUF model from the Hugging Face Hub, pulled into its cache first when not there"
                        + (" (repeatable)" if repeatable else ""))


def without_trio() -> None:
    """Keep trio out of a one-shot command. huggingface_hub's HTTP client (httpcore2) imports
    it, where it is installed, for the locks of its async client; a command that pulls and
    exits uses the synchronous one, and trio's import was 0.1 s of a cached pull's 0.55 s
    (docs/PERFORMANCE.md, session 34). A server keeps it importable."""
    sys.modules.setdefault("trio", None)


def hf_model(spec: str) -> str:
    """Pull ``-hf``'s model when the cache lacks it; the name it is served and loaded by."""
    from ..engine.hf_pull import pull_hf

    return pull_hf(spec).spec.name


def load_model(args: argparse.Namespace, *, threads: int | None = None, n_ctx: int | None = None):
    """The model the arguments name (``-hf`` before ``-m``); ``threads`` overrides ``--threads``,
    ``n_ctx`` shortens its context length."""
    from ..state.model import load

    spec = args.model
    if getattr(args, "hf", None):
        without_trio()
        spec = hf_model(args.hf)
    return load(spec, threads=threads or args.threads, kv=args.kv, n_ctx=n_ctx)


def source_entry(args: argparse.Namespace):
    """The catalog entry, with its layers (system, template, params), of the model ``-m``
    names when a model source (Ollama's store) is where ``load_model`` finds it; else None."""
    import os

    from ..engine.model_source import find_in_sources
    from ..engine.registry import is_known_name
    from ..state.model import MODEL_SOURCES, resolve_model

    spec = args.model
    if getattr(args, "hf", None) or not isinstance(spec, str) or not spec or is_known_name(spec) \
            or os.path.isfile(os.path.expanduser(spec)):
        return None  # a packaged model or a file: no layers
    entry = find_in_sources(MODEL_SOURCES, spec)
    if entry is None or not entry.servable:
        return None  # loading says why it cannot be served
    # A file or a packaged model by that spelling comes before any source (engine/registry.py).
    return entry if resolve_model(spec) == entry.path else None


def add_sampling_arguments(p: argparse.ArgumentParser, *, max_tokens: int, seed_help: str,
                           layered: bool = False) -> None:
    """The sampling options; ``layered``: those not given are None, for a model's params
    layer to set before SAMPLING_DEFAULTS and ``max_tokens`` do (``sampling_options``)."""
    d = dict.fromkeys(SAMPLING_DEFAULTS) if layered else SAMPLING_DEFAULTS
    layer = ", unless the model's params layer sets it" if layered else ""
    p.add_argument("-n", "--max-tokens", type=count, default=None if layered else max_tokens,
                   help=f"tokens to generate at most (default {max_tokens}{layer})")
    p.add_argument("--temperature", type=float, default=d["temperature"], help=f"0 = greedy (default{layer})")
    for name in ("top_k", "top_p", "min_p", "repeat_penalty"):
        p.add_argument(f"--{name.replace('_', '-')}", type=type(SAMPLING_DEFAULTS[name]), default=d[name],
                       help=f"default {SAMPLING_DEFAULTS[name]}{layer}")
    p.add_argument("--seed", type=int, default=None, help=seed_help)
    p.add_argument("--stop", action="append", default=[],
                   help=f"stop string (repeatable{'; given, they replace the params layer' if layered else ''})")


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
    """The SamplerParams fields the sampling arguments set (None: not given, where ``layered``)."""
    return {**{name: getattr(args, name) for name in SAMPLING_DEFAULTS}, "seed": args.seed}
