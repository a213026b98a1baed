"""``ctx serve``: one process, one runtime, two faces.

HTTP (OpenAI, Anthropic, Ollama and contexts routes; ``ctxengine.api``) on
``--port`` and gRPC (contexts and snapshot transfer; ``ctxengine.rpc``) on
``--grpc-port`` share the same models, contexts, scheduler and store. Either
port set to 0 turns that face off. Both bind to loopback unless ``--host``
says otherwise.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import math
import signal
import sys
import threading

from .common import KV_DTYPES, add_hf_argument, hf_model, port_number, thread_count

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 11435
DEFAULT_GRPC_PORT = 11436
SHUTDOWN_STACKS_S = 15.0  # seconds after the signal before a stuck shutdown's stacks are logged


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..api import add_http_arguments
    from ..rpc import add_grpc_arguments

    p.add_argument("-m", "--model", action="append", default=[], metavar="PATH",
                   help="a .gguf file or known name to serve (repeatable; the packaged SmolLM2 is always served)")
    p.add_argument("--models-dir", metavar="DIR", default=None, help="serve every .gguf file under DIR")
    add_hf_argument(p, repeatable=True)
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: loopback only)")
    p.add_argument("--port", type=port_number, default=DEFAULT_HTTP_PORT,
                   help=f"HTTP port (default {DEFAULT_HTTP_PORT}; 0 turns HTTP off)")
    p.add_argument("--grpc-port", type=port_number, default=DEFAULT_GRPC_PORT,
                   help=f"gRPC port (default {DEFAULT_GRPC_PORT}; 0 turns gRPC off)")
    p.add_argument("--store", metavar="DIR", default=None,
                   help="snapshot store directory (default: $CTX_STORE, else the XDG data dir)")
    p.add_argument("-t", "--threads", type=thread_count, default=None,
                   help="threads per model (default: physical cores)")
    p.add_argument("--kv", choices=KV_DTYPES, default="f16", help="KV cache dtype of loaded models")
    p.add_argument("--memory-budget", type=gib, default=None, metavar="GIB",
                   help="unload least recently used models past this many GiB (default: half the RAM)")
    p.add_argument("--repack-budget", type=gib, default=None, metavar="GIB",
                   help="copies of each model's weights laid out for decode, at most this many GiB a model "
                        "(default 0.5; 0: none): faster decode for their size in memory, the same output")
    p.add_argument("--fleet", metavar="redis://HOST:PORT[,...]", default=None,
                   help="share contexts with other hosts through this Redis Cluster (docs/fleet.md)")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH[:SCALE]",
                   help="serve this LoRA adapter with every model it fits, at SCALE by default (default 1; "
                        "repeatable; GET/POST /lora-adapters, a request's \"lora\" field)")
    p.add_argument("--draft", metavar="MODEL", default=None,
                   help="a small model that drafts tokens for speculative decoding, for each served model whose "
                        "vocabulary it shares (the others decode without it, as a warning at start says)")
    p.add_argument("--no-speculative", dest="speculative", action="store_false",
                   help="decode one token per step unless a request asks for speculation "
                        "(it never changes the output, only the speed)")
    p.add_argument("--chat-template-kwargs", type=template_kwargs, default=None, metavar="JSON",
                   help="a JSON object of chat template variables every chat request gets unless its own "
                        "chat_template_kwargs sets them, e.g. '{\"enable_thinking\": false}' for Qwen3")
    add_http_arguments(p)
    add_grpc_arguments(p)


def gib(text: str) -> float:
    """``--memory-budget``'s and ``--repack-budget``'s value: a finite number of GiB, 0 or more
    (0: only the model in use stays; no copies)."""
    x = float(text)
    if not 0 <= x < math.inf:  # False for NaN too
        raise argparse.ArgumentTypeError(f"must be a number of GiB >= 0, not {text}")
    return x


def template_kwargs(text: str) -> dict:
    """``--chat-template-kwargs``' value: a JSON object of template variables (argparse names the option)."""
    from ..errors import CtxError
    from ..text.chat_template import check_template_kwargs

    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, e.g. '{{\"enable_thinking\": false}}', "
                                         f"not {text!r}")
    try:
        return check_template_kwargs(value, "--chat-template-kwargs")
    except CtxError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_runtime(args: argparse.Namespace):
    from ..serving.catalog import catalog_from_args
    from ..serving.lora import LoraSpec
    from ..serving.runtime import Runtime
    from ..store import Store

    lora = [LoraSpec.parse(text, need_file=True) for text in args.lora]
    for spec in args.model:
        check_model("-m", spec)
    if args.draft is not None:
        check_model("--draft", args.draft)
    args.model = [*args.model, *(hf_model(spec) for spec in args.hf)]  # pulled first when not cached
    budget = None if args.memory_budget is None else int(args.memory_budget * (1 << 30))
    repack = None if args.repack_budget is None else int(args.repack_budget * (1 << 30))
    runtime = Runtime(catalog_from_args(args), store=Store(args.store, fleet=args.fleet), threads=args.threads,
                      kv=args.kv, memory_budget=budget, prefix_cache_entries=args.prefix_cache, lora=lora,
                      draft=args.draft, speculative=args.speculative, warn=warning, repack_budget=repack,
                      template_kwargs=getattr(args, "chat_template_kwargs", None))
    try:
        runtime.check_at_start()  # what a model goes without is said now, not found out by its clients
    except BaseException:
        runtime.close()
        raise
    return runtime


def warning(line: str) -> None:
    print(f"ctx serve: warning: {line}", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    from ..api import serve_http
    from ..rpc import start_grpc
    from ..serving.allocator import pin_mmap_threshold

    clash = ("both --port and --grpc-port are 0; nothing to serve" if not args.port and not args.grpc_port else
             f"--port and --grpc-port are both {args.port}" if args.port == args.grpc_port else None)
    if clash is not None:
        print(f"ctx serve: error: {clash}", file=sys.stderr)
        return 2
    for face, port in (("gRPC", args.grpc_port), ("HTTP", args.port)):
        if port:
            check_listen(face, args.host, port)  # before the servers try (and log their own lines)
    pin_mmap_threshold()  # big per-request buffers go back to the system (serving/allocator.py)
    runtime = build_runtime(args)
    grpc_server = None

    def ready(url: str | None) -> None:
        if runtime.fleet is not None:
            runtime.fleet.start(url)  # the first heartbeat (naming the HTTP face) before we say we are up
        if url is not None:
            print(f"ctx serve: HTTP on {url}", file=sys.stderr, flush=True)

    try:
        if args.grpc_port:
            grpc_server = start_grpc(runtime, args)
            print(f"ctx serve: gRPC on {args.host}:{grpc_server.port}", file=sys.stderr, flush=True)
        if args.port:
            if args.api_key is None and not is_loopback(args.host):
                warning(f"no --api-key, and {args.host} is not loopback: anyone who can reach it can use the API "
                        "and the studio")
            # Blocks until SIGINT/SIGTERM; streams in flight are finished or cancelled.
            serve_http(runtime, args, on_ready=ready)
        else:
            ready(None)
            _wait_for_signal()
    finally:
        _stacks_if_stuck()
        if grpc_server is not None:
            grpc_server.stop(grace=5.0)
        runtime.close()
    return 0


def _stacks_if_stuck() -> None:
    """A shutdown that hangs says where: past SHUTDOWN_STACKS_S, every thread's stack goes to
    stderr (the log), through interpreter exit too. Its normal course takes a few seconds.
    With stderr closed or not a file there is nowhere to write them, and nothing is armed."""
    try:
        faulthandler.dump_traceback_later(SHUTDOWN_STACKS_S, exit=False)
    except (AttributeError, OSError, RuntimeError, ValueError):  # sys.stderr None, closed, or without a fileno
        pass


def check_model(option: str, spec: str) -> None:
    """Refuse a model named on the command line that cannot be found, or whose file cannot
    be served (its header read, as the catalog reads it), naming the option."""
    from ..engine.catalog import ModelCatalog
    from ..errors import CtxError
    from ..state.model import MODEL_SOURCES

    entry = ModelCatalog(sources=MODEL_SOURCES).add_spec(spec)  # what the served catalog lists for it
    if not entry.servable:
        raise CtxError(f"{option} {spec}: {entry.error or 'cannot be served'}")


def check_listen(face: str, host: str, port: int) -> None:
    """Refuse, naming the cause, an address this process cannot listen on: a host name
    that does not resolve, a port in use or not ours to take. Each address the host
    resolves to is bound as asyncio (uvicorn) binds it, then let go."""
    import errno
    import socket

    from ..errors import CtxError

    name = host.strip("[]") or None
    try:
        found = socket.getaddrinfo(name, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise CtxError(f"--host {host}: cannot listen there for {face}: the name does not resolve to an "
                       f"address ({err.strerror})") from None
    bound = 0
    for family, kind, proto, _, address in dict.fromkeys(found):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
                bound += 1
            except OSError as err:
                if err.errno == errno.EADDRNOTAVAIL and len(found) > 1:
                    continue  # one of several addresses (localhost's ::1 without IPv6): the others serve
                why = f"port {port} is already in use" if err.errno == errno.EADDRINUSE else err.strerror
                raise CtxError(f"cannot listen for {face} on {_hostport(address[0], port)}: {why}") from None
    if not bound:
        raise CtxError(f"cannot listen for {face} on {_hostport(host, port)}: no address of it can be bound")


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a face on this machine only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
