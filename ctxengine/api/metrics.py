"""Prometheus metrics of one server (``GET /metrics``).

Counters are kept per server (a registry of its own, so tests can run
several in one process); gauges of pages, models and cached prefixes are
read from the runtime at scrape time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..serving.exports import is_host_local

if TYPE_CHECKING:
    from ..serving.events import Finished, Started
    from ..serving.runtime import Runtime


class Metrics:
    def __init__(self, runtime: "Runtime"):
        disable_created_metrics()  # no *_created twin of every counter
        self.registry = r = CollectorRegistry()
        self.requests = Counter("ctx_http_requests", "HTTP requests, by route, method and status",
                                ["route", "method", "status"], registry=r)
        self.prompt_tokens = Counter("ctx_prompt_tokens", "Prompt tokens of generations", ["model"], registry=r)
        self.cached_tokens = Counter("ctx_cached_prompt_tokens",
                                     "Prompt tokens whose KV was reused, not prefilled", ["model"], registry=r)
        self.generated_tokens = Counter("ctx_generated_tokens", "Tokens generated", ["model"], registry=r)
        # Counted as each token is sampled (ctx_generated_tokens at each generation's end): its rate
        # is the tokens/s of the generations running now.
        self.sampled_tokens = Counter("ctx_sampled_tokens", "Tokens sampled so far, as they stream",
                                      ["model"], registry=r)
        self.embedded_tokens = Counter("ctx_embedding_tokens", "Tokens run for embeddings", ["model"], registry=r)
        self.prefill_seconds = Counter("ctx_prefill_seconds", "Time spent prefilling prompts", ["model"], registry=r)
        self.decode_seconds = Counter("ctx_decode_seconds", "Time spent generating", ["model"], registry=r)
        self.cache_hits = Counter("ctx_prefix_cache_hits", "Generations that reused a cached prefix",
                                  ["model"], registry=r)
        self.generations = Counter("ctx_generations", "Generations finished, by finish reason",
                                   ["model", "finish_reason"], registry=r)
        self.drafted_tokens = Counter("ctx_speculative_drafted_tokens",
                                      "Tokens drafted for speculative decoding and verified", ["model"], registry=r)
        self.accepted_tokens = Counter("ctx_speculative_accepted_tokens",
                                       "Drafted tokens the sampler chose too (emitted)", ["model"], registry=r)
        self.active_streams = Gauge("ctx_active_streams", "Streamed responses in progress", registry=r)
        r.register(_RuntimeCollector(runtime))

    def generation(self, started: "Started", finished: "Finished") -> None:
        m = started.model
        self.prompt_tokens.labels(m).inc(started.prompt_tokens)
        self.cached_tokens.labels(m).inc(started.cached_tokens)
        if started.cached_tokens:
            self.cache_hits.labels(m).inc()
        self.prefill_seconds.labels(m).inc(started.prefill_ns / 1e9)
        self.generated_tokens.labels(m).inc(finished.completion_tokens)
        self.decode_seconds.labels(m).inc(finished.decode_ns / 1e9)
        self.generations.labels(m, finished.finish_reason).inc()
        self.drafted_tokens.labels(m).inc(finished.drafted_tokens)
        self.accepted_tokens.labels(m).inc(finished.accepted_tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _RuntimeCollector:
    def __init__(self, runtime: "Runtime"):
        self.runtime = runtime

    def describe(self):
        return []  # collected fresh at every scrape

    def collect(self):
        pages = GaugeMetricFamily("ctx_kv_pages_in_use", "KV pages in use", labels=["model"])
        capacity = GaugeMetricFamily("ctx_kv_pages_max", "KV pages the pool can hold", labels=["model"])
        backed = GaugeMetricFamily("ctx_kv_pages_allocated", "KV pages backed by memory (in use or free to reuse)",
                                   labels=["model"])
        contexts = GaugeMetricFamily("ctx_contexts", "Named contexts (the prefix cache's not counted)",
                                     labels=["model"])
        prefixes = GaugeMetricFamily("ctx_prefix_cache_entries", "Cached request contexts", labels=["model"])
        queued = GaugeMetricFamily("ctx_forward_queue", "Forward requests waiting for a batched step",
                                   labels=["model"])
        rows = CounterMetricFamily("ctx_forward_tokens", "Tokens run through the model's forward steps since it "
                                   "loaded (prompts, decoded tokens and drafts)", labels=["model"])
        loaded = self.runtime.loaded()
        for e in loaded:
            pool = e.model.engine.pool
            pages.add_metric([e.entry.name], pool.n_used)
            capacity.add_metric([e.entry.name], pool.max_pages)
            backed.add_metric([e.entry.name], pool.n_allocated)
            contexts.add_metric([e.entry.name], sum(not is_host_local(n) for n in e.model.contexts.names()))
            prefixes.add_metric([e.entry.name], len(e.prefix_cache) if e.prefix_cache is not None else 0)
            queued.add_metric([e.entry.name], e.model.engine.scheduler.n_queued)
            rows.add_metric([e.entry.name], e.model.engine.scheduler.rows)
        models = GaugeMetricFamily("ctx_models_loaded", "Models loaded", value=len(loaded))
        return [pages, capacity, backed, contexts, prefixes, queued, rows, models]
