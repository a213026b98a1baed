"""``ctx`` verbs for named contexts, working offline against the snapshot store.

Without a server a named context *is* its ref in the store: a verb that
changes a context restores it (checking the weights and every page), changes
it, and snapshots it back under the same ref. Each verb is its own module
(cli/main.py's VERBS); what they share is here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from ...errors import CtxError, RefConflictError, StoreError
from ..common import add_model_arguments, load_model  # noqa: F401  (the verbs import load_model from here)

EVICTED_PREFIX = "_evicted/"  # refs the context table keeps for evicted contexts
RESPONSES_PREFIX = "responses/"  # refs of the Responses API's stored responses (api/response_store.py)


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """``--store DIR`` and ``-m MODEL`` (every context and store verb takes both)."""
    add_model_arguments(p)
    p.add_argument("--store", metavar="DIR", default=None,
                   help="snapshot store directory (default: $CTX_STORE, else the XDG data dir)")


def open_store(args: argparse.Namespace, *, existing: bool = False):
    """The store ``--store`` names; ``existing``: only one that is there (a verb that only
    reads or removes would otherwise leave an empty store behind where a path was mistyped)."""
    import os
    from pathlib import Path

    from ...store import Store
    from ...store.store import default_store_path

    if existing and (args.store is None or os.fspath(args.store)):  # an empty path: Store says why
        path = Path(args.store).expanduser() if args.store is not None else default_store_path()
        if not (path / "data.mdb").is_file():
            raise StoreError(f"no snapshot store at {path} (nothing was ever stored there; "
                             "--store DIR or $CTX_STORE names another)")
    return Store(args.store)


def check_name(name: str, what: str = "context") -> str:
    """``name``, if valid. A context name (one a verb creates or changes) must not be the
    server's (``_...``); a ref a verb only reads or removes (``what="ref"``) may be."""
    from ...store.names import validate_client_name, validate_name

    return (validate_client_name if what == "context" else validate_name)(name, what)


def require_absent(store, name: str, *, force: bool = False) -> None:
    """Refuse early, before a model loads, to create ``name`` where it exists (the move
    itself checks again: another process may create it meanwhile); ``force``: the verb
    has ``--force``, which the refusal then offers."""
    from ...store.names import validate_client_name

    validate_client_name(name, "ref")
    if name in store.refs():
        how = f"--force moves it, or ctx rm {name} first" if force else f"ctx rm {name} first"
        raise StoreError(f"'{name}' already exists in {store.path} ({how})")


def open_context(model, store, name: str):
    """The stored context ``name`` as a live context of ``model``."""
    check_name(name)
    if name not in store.refs():
        raise StoreError(f"no context named '{name}' in {store.path} (ctx new {name} creates one)")
    return model.restore(store, name, name=name)


def save(ctx, store, ref: str) -> str:
    """Snapshot ``ctx`` back under ``ref`` and say so on stderr.

    ``ref`` moves only if it still holds the snapshot ``ctx`` was restored from (for a
    new context: only if it does not exist), checked in the move's own transaction:
    two commands that read the same context cannot both save it, the second dropping
    the first's work. The loser's snapshot stays stored, and its error names it.
    """
    base = ctx.snapshot_id
    for attempt in (1, 2):
        sid = ctx.snapshot(store)
        try:
            store.set_ref(ref, sid, expect=base)
            break
        except RefConflictError:
            what = "created" if base is None else "changed"
            raise StoreError(f"'{ref}' was {what} by another process while this command ran and is left as it "
                             f"saved it; this command's work is snapshot {sid[:12]}, kept until ctx gc "
                             f"(ctx restore {sid[:12]} --as NAME keeps it)") from None
        except StoreError:
            if attempt == 2:
                raise
            # No ref holds the snapshot until the move, so a gc in another process may
            # have collected it in between: write it once more, with the same parent.
            ctx.snapshot_id = base
    print(f"{ref}: {ctx.n_tokens} tokens, snapshot {sid[:12]}", file=sys.stderr)
    return sid


def chat_turn(model, ctx, role: str, text: str) -> str:
    """The text a chat template adds to ``ctx`` for one more message of ``role``."""
    if model.chat_template is None:
        raise CtxError(f"{model.name} has no chat template; append plain text instead of --role")
    if role == "system":
        from ...errors import RequestError
        from ...state.conversation import system_turn

        try:
            return system_turn(model.engine, text, after=ctx.tokens)
        except RequestError:
            raise no_system_turn(model, ctx, "--role system") from None
    return model.chat.render([{"role": role, "content": text}], after=ctx.tokens,
                             generation_prompt=role == "user")


def no_system_turn(model, ctx, option: str) -> CtxError:
    """The usage error for a system message the model's template would drop (Gemma 3's has no
    system turn), saying what to do instead from the command line."""
    from ..common import UsageError

    return UsageError(f"{option}: {model.name}'s chat template has no system turn (it shows a system message "
                      f"only inside the first user turn), so this one alone would be dropped: put its text at "
                      f"the start of the first user message instead (ctx append {ctx.name} --role user TEXT)")


def describe(store, sid: str) -> dict:
    """A short summary of a stored snapshot (for ls and log)."""
    m = store.get_manifest(sid)
    return {"snapshot": sid, "tokens": len(m.token_ids), "model": m.model_name,
            "weight_id": m.weight_id, "created": m.created, "labels": m.labels, "parent": m.parent}


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


@contextmanager
def progress_bar(desc: str, unit: str = "page") -> Iterator:
    """A ``progress(done, total)`` callback drawing a bar on stderr when it is a terminal."""
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety, not a requirement
        yield None
        return
    bar = tqdm(desc=desc, unit=unit, file=sys.stderr, disable=None, leave=False)

    def progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
            bar.refresh()
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()
