"""Snapshot and restore: between a live context and a snapshot store.

A snapshot is a manifest (weights, tokens, sampler state, ordered page keys)
plus the raw bytes of the context's KV pages; the store (ctxengine.store)
keeps both content-addressed. This module is the only place that turns a
page table into store pages and back; the table a context lives in
(state/table.py) calls it to snapshot, restore, evict and bring back.

* **Incremental.** Every page is named by the BLAKE3 of its bytes and the
  store is asked which keys it lacks; only those are sent. Because the
  kernels are deterministic and slots past a sequence's end are zero, two
  contexts that computed the same prefix have the same page keys.
* **Hashing once.** A full page never changes while it is referenced, so its
  key is remembered by page id (:class:`PageKeyCache`) and re-snapshotting a
  context that grew hashes only its new pages.
* **Restore refuses other weights** before reading a single page, and every
  page is verified against its key as the store reads it. The last token's
  logits are not stored: the restored context recomputes them on first use by
  re-forwarding that one token (``Context._sync``), which the deterministic
  kernels make bit-identical to the original's.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from ..text.grammar import Constraint, check_state as check_grammar_state
from ..engine.lora import LoraSet, continuing_set
from ..engine.sampler import Sampler
from ..errors import ContextError, CorruptDataError, CtxError, StoreError, WeightMismatchError
from ..store import Manifest, Store, page_key, validate_name
from ..store.manifest import checked_labels, new_labels

from .page_keys import PageKeyCache

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from .context import Context, Table

# Byte layout of a KV page (docs/design-notes.md, "KV page layout (format v1)").
# Recorded in every manifest's arch summary; a restore refuses another value.
KV_LAYOUT = 1
# Restore reads pages in chunks of this many (one read transaction each) on a
# few threads: decompressing and verifying dominate restore, and zstd and
# BLAKE3 release the GIL. At most RESTORE_THREADS * 2 chunks are in flight
# (16 SmolLM2 pages ≈ 6 MB each), so memory stays bounded on long contexts.
RESTORE_CHUNK = 16
RESTORE_THREADS = min(4, os.cpu_count() or 1)
# Model settings that shape the KV. The weight id already covers them; they
# are repeated so a manifest says what it holds without the weights at hand.
_ARCH_FIELDS = ("arch", "n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_vocab",
                "rope_base", "rope_dim", "rope_neox")


@dataclass(frozen=True)
class SnapshotResult:
    snapshot_id: str
    n_pages: int        # pages the manifest names
    pages_hashed: int   # pages whose key had to be computed (the others came from the cache)
    pages_sent: int     # pages the store lacked, and was given
    bytes_sent: int     # raw bytes of those pages


# -- snapshot ------------------------------------------------------------------

def snapshot(ctx: "Context", store: Store, ref: str | None = None,
             labels: Mapping[str, str] | None = None) -> str:
    """Write the context to the store (only the pages it lacks); return the snapshot id.

    Tokens whose KV lags (the last sampled one) are prefilled first, so a
    snapshot holds the KV of every token. ``labels`` are added to the
    context's own. ``ref``, if given, is moved to the new snapshot in the same
    transaction.
    """
    return take_snapshot(ctx, store, ref=ref, labels=labels).snapshot_id


def take_snapshot(ctx: "Context", store: Store, *, ref: str | None = None,
                  labels: Mapping[str, str] | None = None, sync: bool = True,
                  record: bool = True) -> SnapshotResult:
    """``snapshot`` with its accounting.

    ``sync=False`` stores the KV as it is (n_tokens may then be less than the
    token count; a restore prefills the rest) and never runs the model.
    ``record=False`` leaves the context's parent pointer alone.
    """
    if ref is not None:
        validate_name(ref, "ref")
    merged = _merged_labels(ctx.labels, labels)
    with ctx.hold():
        if sync:
            ctx._sync()
        result = write_pages(ctx, ctx._kv.seq, store, ref=ref, labels=merged)
        if record:
            ctx.snapshot_id = result.snapshot_id
    return result


def write_pages(ctx: "Context", seq, store: Store, *, ref: str | None,
                labels: Mapping[str, str]) -> SnapshotResult:
    """Write ``seq``, the page table of ``ctx``, as it is, with the context's tokens and
    state and these labels. The caller keeps the pages from changing: it holds the
    context, or the context is EVICTING (the table writes it out to free its pages)."""
    keys, exported, hashed = _page_keys(seq, ctx._table.page_keys)
    m = _manifest(ctx, seq, keys, dict(labels))
    sid, sent, nbytes = _write(store, m, seq, keys, exported, ref)
    return SnapshotResult(sid, len(keys), hashed, sent, nbytes)


def _merged_labels(own: Mapping[str, str], extra: Mapping[str, str] | None) -> dict[str, str]:
    return checked_labels({**own, **new_labels(extra)})


def _page_keys(seq, cache: PageKeyCache) -> tuple[list[str], dict[str, bytes], int]:
    """Every page's key, in order; the raw bytes of those we had to read; how many we hashed."""
    pt = cache._page_tokens
    n = seq.n_tokens
    page_ids = seq.pages[: -(-n // pt)]
    keys: list[str] = []
    exported: dict[str, bytes] = {}
    new_full = []
    released = seq.n_released  # leading pages in the trim pool: their ids are another pool's, never cached
    for i, pid in enumerate(page_ids):
        full = (i + 1) * pt <= n and i >= released
        key = cache.get(pid) if full else None
        if key is None:
            raw = seq.export_page(i)
            key = page_key(raw)
            exported[key] = raw
            if full:
                new_full.append((pid, key))
        keys.append(key)
    # Only full pages are cached: the last, partly filled page is still written to.
    cache.remember(new_full)
    return keys, exported, len(exported)


def arch_summary(engine: "Engine") -> dict:
    cfg = engine.config
    summary = {name: getattr(cfg, name) for name in _ARCH_FIELDS}
    summary["kv_layout"] = KV_LAYOUT
    if cfg.swa_window:  # what a released page holds (manifest released_pages)
        summary["swa_window"] = cfg.swa_window
        summary["swa_kept_layers"] = list(engine.kept_layers)
    return summary


def _manifest(ctx: "Context", seq, keys: list[str], labels: dict[str, str]) -> Manifest:
    engine = ctx.engine
    arch = arch_summary(engine)
    if ctx.lora:  # the adapters that made the KV with the weights (docs/lora.md)
        arch["lora"] = ctx.lora.identity
    return Manifest(
        weight_id=engine.weight_id, model_name=engine.name, arch=arch,
        kv_dtype=engine.kv_dtype, page_tokens=engine.pool.page_tokens,
        token_ids=list(ctx._tokens), page_keys=keys, page_size=engine.pool.page_bytes,
        n_tokens=seq.n_tokens, sampler_state=_sampler_state(ctx),
        parent=ctx.snapshot_id, labels=labels, released_pages=seq.n_released,
    )


def _sampler_state(ctx: "Context") -> dict:
    """The sampler's state, with an unfinished grammar under "grammar" (docs/store-format.md)."""
    state = dict(ctx.sampler_state or {})
    grammar = ctx.constraint_state()
    if grammar is not None:
        state["grammar"] = grammar
    return state


def _write(store: Store, m: Manifest, seq, keys: list[str], exported: dict[str, bytes],
           ref: str | None) -> tuple[str, int, int]:
    """Send the pages the store lacks with the manifest; (snapshot id, pages sent, bytes)."""
    first_index = {}
    for i, key in enumerate(keys):
        first_index.setdefault(key, i)

    def raw(key: str) -> bytes:
        return exported[key] if key in exported else seq.export_page(first_index[key])

    missing = store.missing_pages(keys)
    pages = {k: raw(k) for k in missing}
    try:
        sid = store.snapshot(m, pages, ref=ref)
    except CorruptDataError:
        raise
    except StoreError:
        # A gc in another process may have removed a page between our question
        # and the write; then send those too, once. Anything else is real.
        vanished = [k for k in store.missing_pages(keys) if k not in pages]
        if not vanished:
            raise
        pages.update((k, raw(k)) for k in vanished)
        sid = store.snapshot(m, pages, ref=ref)
    return sid, len(pages), sum(map(len, pages.values()))


# -- restore -------------------------------------------------------------------

def check_compatible(m: Manifest, sid: str, engine: "Engine", lora: LoraSet | None = None) -> LoraSet:
    """Refuse a snapshot this model (with these adapters) cannot continue, the weights
    checked first; the adapters it continues with."""
    what = f"snapshot {sid[:16]}"
    if m.weight_id != engine.weight_id:
        raise WeightMismatchError(
            f"{what} was made by weights {m.weight_id} ({m.model_name}), but the loaded model "
            f"has weights {engine.weight_id} ({engine.name}); refusing to restore it onto other weights")
    lora = continuing_set(m.arch.get("lora", []), engine.adapters.values(), lora, what)
    if m.kv_dtype != engine.kv_dtype:
        raise StoreError(f"{what} holds its KV in {m.kv_dtype}, but the model is loaded with kv='{engine.kv_dtype}'; "
                         f"load the model with kv='{m.kv_dtype}' (ctx: --kv {m.kv_dtype}) to restore it")
    layout = m.arch.get("kv_layout")
    if layout != KV_LAYOUT:
        raise StoreError(f"{what} uses KV page layout {layout!r}; this ctxengine reads layout {KV_LAYOUT}")
    pool = engine.pool
    if m.page_tokens != pool.page_tokens or m.page_size != pool.page_bytes:
        raise StoreError(f"{what} has pages of {m.page_tokens} tokens ({m.page_size} bytes); this model's "
                         f"pages hold {pool.page_tokens} tokens ({pool.page_bytes} bytes)")
    if m.released_pages:
        seq = engine.new_sequence()
        if engine.trim_pool is None or m.arch.get("swa_kept_layers") != list(engine.kept_layers):
            raise StoreError(f"{what} holds {m.released_pages} released sliding-window pages, which this "
                             f"model's pages cannot take")
        if m.released_pages > seq.release_target(m.n_tokens) + 1:
            raise CorruptDataError(f"{what} claims {m.released_pages} released pages; a {m.n_tokens}-token "
                                   f"context releases at most {seq.release_target(m.n_tokens) + 1}")
    cfg = engine.config
    if len(m.token_ids) > cfg.n_ctx:
        raise ContextError(f"{what} holds {len(m.token_ids)} tokens; the model is loaded with a "
                           f"context length of {cfg.n_ctx}")
    bad = next((t for t in m.token_ids if t >= cfg.n_vocab), None)
    if bad is not None:
        raise CorruptDataError(f"{what} holds token id {bad}, outside the vocabulary (0..{cfg.n_vocab - 1})")
    if m.sampler_state:
        try:
            Sampler.from_state(m.sampler_state)
            if "grammar" in m.sampler_state:
                if check_grammar_state(m.sampler_state["grammar"]) > len(m.token_ids):
                    raise CtxError("its grammar starts past its last token")
                # compiled and replayed now, not at the first generate: a grammar that does not
                # compile, or that its tokens break, restored and then failed every generation
                Constraint.from_state(m.sampler_state["grammar"], engine.tokenizer, m.token_ids)
        except CtxError as err:
            raise CorruptDataError(f"{what}: {err}") from None
    return lora


def load_sequence(table: "Table", store: Store, m: Manifest, sid: str):
    """Read, verify and import a manifest's pages into a new page table."""
    engine = table.engine
    pool = engine.pool
    pt = pool.page_tokens
    released = m.released_pages  # leading pages holding only the full-attention layers (trim pool)
    unique = list(dict.fromkeys(m.page_keys))
    pool_of = {k: engine.trim_pool for k in m.page_keys[:released]}
    if any(k in pool_of for k in m.page_keys[released:]):
        raise CorruptDataError(f"snapshot {sid[:16]} names one page both released and whole")
    promise = table.reserve_pages(len(unique) - len(pool_of))
    imported: dict[str, tuple[object, int]] = {}
    seq = engine.new_sequence()
    try:
        try:
            for key, raw in _read_pages(store, unique):
                target = pool_of.get(key, pool)
                imported[key] = (target, target.import_page(raw))
        except CorruptDataError as err:
            raise CorruptDataError(f"cannot restore snapshot {sid[:16]}: {err}") from None
        except ValueError as err:  # a page of the wrong size for its pool
            raise CorruptDataError(f"cannot restore snapshot {sid[:16]}: {err}") from None
        for i, key in enumerate(m.page_keys):
            seq.append_page(imported[key][1], min(pt, m.n_tokens - i * pt), i < released)
        table.page_keys.remember((imported[k][1], k) for i, k in enumerate(m.page_keys)
                                 if (i + 1) * pt <= m.n_tokens and i >= released)
    finally:
        for target, pid in imported.values():
            target.release(pid)  # the page table (and the cache) hold their own references
        promise.release()  # the pages are taken (or given back): counted by the pool itself now
    return seq


def _read_pages(store: Store, keys: list[str]):
    """Yield (key, verified raw bytes) in order, reading chunks on a few threads."""
    chunks = [keys[i:i + RESTORE_CHUNK] for i in range(0, len(keys), RESTORE_CHUNK)]
    if len(chunks) <= 1 or RESTORE_THREADS == 1:
        for chunk in chunks:
            yield from zip(chunk, store.get_pages(chunk))
        return
    with ThreadPoolExecutor(RESTORE_THREADS, thread_name_prefix="ctx-restore") as ex:
        pending: deque = deque()
        todo = iter(chunks)
        try:
            for chunk in todo:
                pending.append((chunk, ex.submit(store.get_pages, chunk)))
                if len(pending) >= 2 * RESTORE_THREADS:
                    break
            while pending:
                chunk, fut = pending.popleft()
                raws = fut.result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt, ex.submit(store.get_pages, nxt)))
                yield from zip(chunk, raws)
        finally:
            for _, fut in pending:
                fut.cancel()
