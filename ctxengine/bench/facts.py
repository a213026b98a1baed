"""What a speed figure needs beside it to mean anything: the machine, the SIMD
path each engine ran, the date, and how fast this machine can read memory.

Shared by ``ctx bench`` (speed.py) and the scripts in bench/. Decode of a small model reads
every weight once per token, so bytes of weights per token x tokens per second
is the read rate decode reached; next to the probe's rate it says how close
to the memory ceiling an engine runs (or that the weights partly sat in cache).
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .. import _core
from ..engine.cpu import cpu_flags, cpu_model, last_level_cache_bytes
from ..engine.gguf_file import open_gguf

PROBE_MIN_BYTES = 256 << 20  # and at least 8x the last-level cache, so the probe reads DRAM


def round_order(items: list, round_no: int) -> list:
    """The order to measure items in, round number round_no: rotated one further each round.
    Alternating alone is not fair on the machines we measure: the first engine or build of a
    round ran 1-4% faster, and each decode's pages come from the free list the one before it
    left, so a fixed order gives an item the same memory every round (2-10% on machine C,
    docs/PERFORMANCE.md)."""
    k = round_no % len(items) if items else 0
    return items[k:] + items[:k]


def simd_flags() -> list[str]:
    """The /proc/cpuinfo flags our SIMD paths need, in their order (present or not)."""
    names: list[str] = []
    for isa in ("avx2", "avx512"):
        names += [cpu for _, cpu in _core.isa_features(isa) if cpu not in names]
    return names


def machine_facts(threads: int) -> dict:
    """CPU model, which SIMD flags it has and lacks, our SIMD path, threads, date."""
    flags = cpu_flags()
    return {"cpu": cpu_model(), "simd_flags": [f for f in simd_flags() if f in flags],
            "missing_simd_flags": [f for f in simd_flags() if f not in flags],
            "l3_bytes": last_level_cache_bytes(), "isa": _core.active_isa(), "threads": threads,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}  # others' work on a shared machine


def read_bandwidth(threads: int, reps: int = 5) -> float:
    """Median bytes/s that ``threads`` threads read, each taking the max of its
    share of a float32 buffer far larger than the last-level cache.

    numpy's max is SIMD and releases the GIL, so this is bound by memory, not
    by the loop (sum is not: its pairwise adds run at about half this rate).
    """
    size = max(PROBE_MIN_BYTES, 8 * (last_level_cache_bytes() or 0))
    buf = np.ones(size // 4, np.float32)  # written once: every page is mapped before timing
    parts = np.array_split(buf, threads)
    rates = []
    for _ in range(reps):
        start = threading.Barrier(threads + 1)

        def read(part):
            start.wait()
            part.max()

        workers = [threading.Thread(target=read, args=(p,)) for p in parts]
        for w in workers:
            w.start()
        start.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        rates.append(buf.nbytes / (time.perf_counter() - t0))
    return statistics.median(rates)


def weight_bytes_per_token(path: str | Path) -> int:
    """Bytes of weights one decode step reads: every tensor, except that the
    token embedding gives only one row when the file has its own output matrix
    (with tied embeddings the whole table is the output projection)."""
    with open_gguf(path) as f:
        total = sum(t.nbytes for t in f.tensors.values())
        embd = f.tensors.get("token_embd.weight")
        if embd is not None and "output.weight" in f.tensors:
            total -= embd.nbytes - embd.nbytes // embd.shape[1]
    return total


def describe_machine(facts: dict) -> str:
    lacks = f" (lacks {' '.join(facts['missing_simd_flags'])})" if facts["missing_simd_flags"] else ""
    l3 = f", L3 {facts['l3_bytes'] >> 20} MiB" if facts.get("l3_bytes") else ""
    return (f"{facts['date']}; {facts['cpu']}{l3}; SIMD flags {' '.join(facts['simd_flags'])}{lacks}; "
            f"our SIMD path: {facts['isa']}; load average {facts['load_average'][0]:.1f}")


def describe_decode(engine: str, decode_tps: float, weight_bytes: int, bandwidth: float) -> str:
    """'ours: 250 tok/s x 92.3 MB = 23.1 GB/s, 85% of the probe' (and why it may exceed 100%)."""
    rate = decode_tps * weight_bytes
    line = (f"{engine}: {decode_tps:.1f} tok/s x {weight_bytes / 1e6:.1f} MB = {rate / 1e9:.1f} GB/s, "
            f"{rate / bandwidth:.0%} of the probe")
    if rate > bandwidth:
        line += " (more than the probe read: part of the weights stayed in cache between tokens)"
    return line
