"""Embeddings for OpenAI's ``/v1/embeddings`` and Ollama's ``/api/embed``,
``/api/embeddings``: the model's final normed hidden states, mean-pooled
over the input's tokens and L2-normalised (not on Ollama's legacy
``/api/embeddings``, whose handler returns the pooled vector as it is),
each input within the context a generation would get (Ollama's ``num_ctx``:
the request's option, else the params layer's, within the model's),
under the LoRA adapters a generation of the same request would run with
(a ``lora`` field, else the model's default scales and its own ADAPTER layers).

Each input runs on a page table of its own that is dropped afterwards (the
hidden states are not what a later request could reuse); inputs run one
after the other on a worker thread, their forward steps batched with
whatever else the model is doing, CHUNK tokens at a time (an 8k-token input
sent as one step held every generation on the model for its whole prefill);
a client that goes away stops its input at the scheduler's next step.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio.to_thread
import numpy as np

from ..serving.exports import cancelled_when
from .errors import ApiError
from .options import context_length
from .streaming import until_disconnect

if TYPE_CHECKING:
    from starlette.requests import Request

CHUNK = 512  # tokens an input sends to the scheduler at a time
MAX_INPUTS = 2048  # inputs a request may hold, as OpenAI's (each is a forward of its own)


@dataclass
class Embeddings:
    model: str             # the catalog entry's name
    vectors: list[np.ndarray]
    n_tokens: int
    load_ns: int
    total_ns: int


def _embed(runtime, name: str | None, inputs: list, *, truncate: bool, dimensions: int | None, normalize: bool,
           num_ctx: int | None, lora: list | None, gone: threading.Event) -> Embeddings:
    t0 = time.perf_counter_ns()
    entry = runtime.resolve(name)
    with runtime.lease(entry.name) as model:
        load_ns = time.perf_counter_ns() - t0
        adapters = runtime.loras(entry.name).for_request(lora)  # of the leased model; unknown ones: a 400
        engine = model.engine
        if dimensions is not None and not 1 <= dimensions <= engine.config.n_embd:
            raise ApiError(400, f"dimensions must be in 1..{engine.config.n_embd} for {entry.name}")
        limit = context_length(entry, engine.config.n_ctx, num_ctx)  # as Ollama's embed handler
        vectors, n_tokens = [], 0
        for item in inputs:
            ids = _ids(model, item)
            if len(ids) > limit:
                if not truncate:
                    raise ApiError(400, f"input exceeds maximum context length: an input is {len(ids)} tokens; "
                                        f"the context length is {limit}")
                ids = ids[:limit]
            seq, total = engine.new_sequence(), np.zeros(engine.config.n_embd, np.float64)
            # Room for its pages is made when the scheduler admits each chunk; other requests' steps
            # run between them, and a client gone stops it at the next step (cancelled_when).
            try:
                with cancelled_when(gone.is_set):
                    for start in range(0, len(ids), CHUNK):
                        part = engine.forward_hidden(seq, ids[start:start + CHUNK],
                                                     reserve=model.contexts.reserve_pages, lora=adapters)
                        total += part.astype(np.float64).sum(axis=0)
            finally:
                # its pages back now, not when a collection finds it (truncate(0) is refused once
                # a sliding window released pages: Gemma 3's inputs of 543 tokens and more were a 500)
                del seq
            v = (total / len(ids))[:dimensions]
            norm = np.linalg.norm(v) if normalize else 0.0
            vectors.append((v / norm if norm > 0 else v).astype(np.float32))
            n_tokens += len(ids)
        return Embeddings(entry.name, vectors, n_tokens, load_ns, time.perf_counter_ns() - t0)


def _ids(model, item) -> list[int]:
    if isinstance(item, str):
        # empty text is refused whatever the model (a BOS alone was embedded where one is added)
        ids = model.tokenizer.with_bos(model.tokenize(item)) if item else []
    else:  # token ids, each checked (["a"] or 2**64 were a 500)
        ids = model.engine.checked_ids(item)
    if not ids:
        raise ApiError(400, "cannot embed an empty input")
    return ids


async def embed(runtime, name: str | None, inputs: list, *, truncate: bool = True,
                dimensions: int | None = None, normalize: bool = True, num_ctx: int | None = None,
                lora: list | None = None, metrics=None, client: "Request | None" = None) -> Embeddings:
    """Embed each input (a string, or a list of token ids), L2-normalised unless
    ``normalize`` is false, under the adapters ``lora`` picks (a request's field; None:
    the model's scales); an input longer than the context (``num_ctx``, Ollama's option,
    else the params layer's, within the model's) is cut to it, or with ``truncate`` false
    refused; ``client`` going away (its body read) stops the work at the next chunk."""
    if not inputs:
        raise ApiError(400, "no input to embed")
    if len(inputs) > MAX_INPUTS:
        raise ApiError(400, f"{len(inputs)} inputs are more than the {MAX_INPUTS} a request may hold")
    gone = threading.Event()
    watch = asyncio.ensure_future(_left(client, gone)) if client is not None else None
    try:
        result = await anyio.to_thread.run_sync(
            lambda: _embed(runtime, name, inputs, truncate=truncate, dimensions=dimensions,
                           normalize=normalize, num_ctx=num_ctx, lora=lora, gone=gone))
    finally:
        if watch is not None:
            watch.cancel()
    if metrics is not None:
        metrics.embedded_tokens.labels(result.model).inc(result.n_tokens)
    return result


async def _left(client: "Request", gone: threading.Event) -> None:
    await until_disconnect(client)
    gone.set()
