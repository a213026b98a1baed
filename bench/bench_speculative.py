"""Decode speed with speculation (drafts verified several to a forward) vs without,
and vs llama.cpp's prompt-lookup speculation on the same prompts.

    python bench/bench_speculative.py [-m MODEL] [--threads 2] [--reps 3] [--no-llama]

Workloads (greedy unless said):
- edit: the prompt holds a ~400-token JSON document; the reply rewrites it with one change;
- free: a story at temperature 0.8, seed 1 (no text to copy);
- branches: 8 forks of one conversation regenerate its last reply at once, seeds 1..8,
  temperature 0.8 (aggregate tokens/s; siblings' replies are drafts for each other).
Decode tokens/s counts the tokens after the first (whose time includes the prefill),
for us and for llama.cpp (llama-cpp-python's ``LlamaPromptLookupDecoding``, in the
interpreter given by --llama-python, best of num_pred_tokens 2 and 10). The ways are
alternated within each repetition and medians quoted; our output with speculation
is checked to be the tokens without it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

DOC = {"service": "inventory", "version": "2.3.1", "owner": {"team": "storage", "email": "storage@example.com"},
       "regions": ["eu-west-1", "us-east-2", "ap-south-1"],
       "limits": {"max_items": 5000, "max_batch": 250, "timeout_ms": 1500, "retries": 3},
       "endpoints": [{"path": "/items", "method": "GET", "auth": True, "cache_seconds": 30},
                     {"path": "/items", "method": "POST", "auth": True, "cache_seconds": 0},
                     {"path": "/items/{id}", "method": "DELETE", "auth": True, "cache_seconds": 0},
                     {"path": "/health", "method": "GET", "auth": False, "cache_seconds": 5}],
       "features": {"bulk_import": True, "soft_delete": False, "audit_log": True, "webhooks": False},
       "database": {"engine": "postgres", "host": "db.internal", "port": 5432, "pool_size": 20},
       "tags": ["core", "billing", "tier-1"]}
EDIT = ("Here is a JSON configuration file:\n\n" + json.dumps(DOC, indent=2)
        + "\n\nRewrite the whole file with one change: set \"retries\" to 5. Output only the JSON.")
FREE = "Write a short story about a lighthouse keeper who finds a strange machine on the beach."
BRANCH = "Give me three ideas for a weekend trip from Lisbon, one sentence each."

LLAMA = r"""
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
a = json.loads(sys.argv[1])
out = {}
for k in a["pred"]:
    llm = Llama(a["path"], n_threads=a["threads"], n_ctx=2048, verbose=False, logits_all=bool(k),
                draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k) if k else None)
    runs = []
    for _ in range(a["reps"]):
        llm.reset()
        n, t0 = 0, None
        for tok in llm.generate(a["ids"], temp=0.0, top_k=1, reset=True):
            n += 1
            if n == 1:
                t0 = time.perf_counter()
            if tok == llm.token_eos() or n >= a["gen"]:
                break
        runs.append((n - 1) / (time.perf_counter() - t0))
    out[str(k)] = runs
    del llm
print(json.dumps(out))
"""


def decode_run(model, ids, n_gen, speculative, **sampling):
    """(tokens, decode tok/s after the first token, speculation stats)."""
    c = model.context(None)
    c.append(ids)
    toks, t0 = [], None
    for p in c.generate(n_gen, speculative=speculative, **sampling):
        if p.token_id is None:
            continue
        toks.append(p.token_id)
        if len(toks) == 1:
            t0 = time.perf_counter()
    rate = (len(toks) - 1) / (time.perf_counter() - t0) if len(toks) > 1 else float("nan")  # nan: ended at once
    stats = c.speculation
    c.delete()
    return toks, rate, stats


def branches_run(model, ids, n_gen, speculative, n=8):
    """Aggregate tok/s of n forks regenerating one reply at once (seeds 1..n)."""
    root = model.context(None)
    root.append(ids)
    list(root.generate(n_gen, temperature=0.8, seed=100, speculative=False))  # the reply they regenerate
    forks = [root.fork(n_tokens=len(ids)) for _ in range(n)]
    out = [None] * n

    def go(i):
        out[i] = [p.token_id for p in forks[i].generate(n_gen, temperature=0.8, seed=i + 1,
                                                         speculative=speculative)]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    accepted = sum(f.speculation.accepted for f in forks)
    for f in forks:
        f.delete()
    root.delete()
    return out, sum(map(len, out)) / dt, accepted


def llama_run(args, path, ids) -> dict[str, list[float]]:
    """llama.cpp's decode tok/s on the edit prompt: without drafts, and prompt lookup of 2 and 10."""
    arg = json.dumps({"path": str(path), "threads": args.threads, "ids": ids, "gen": args.gen,
                      "reps": 1, "pred": [0, 2, 10]})
    return json.loads(subprocess.run([args.llama_python, "-c", LLAMA, arg], check=True,
                                     capture_output=True, text=True).stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gen", type=int, default=400)
    ap.add_argument("--llama-python", default="/opt/llamavenv/bin/python")
    ap.add_argument("--no-llama", action="store_true")
    args = ap.parse_args()

    import ctxengine as ce
    from ctxengine.bench.facts import describe_machine, machine_facts

    model = ce.load(args.model, threads=args.threads)
    def chat(text: str) -> list[int]:
        # A conversation's tokens as a context takes them, BOS first where the model wants
        # one (Gemma 3 without it answers in loops of markup, which lookup drafts all too well).
        ids = model.tokenize(model.chat_prompt([{"role": "user", "content": text}]), parse_special=True)
        return model.tokenizer.with_bos(ids)

    edit_ids, free_ids, branch_ids = chat(EDIT), chat(FREE), chat(BRANCH)
    print(f"{model.name}, {args.threads} threads; edit prompt {len(edit_ids)} tokens")
    print(describe_machine(machine_facts(args.threads)))
    decode_run(model, free_ids, 8, True, temperature=0.0)  # warm-up

    llama = not args.no_llama and Path(args.llama_python).exists()
    res: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for name, ids, n_gen, sampling in (("edit", edit_ids, args.gen, dict(temperature=0.0)),
                                           ("free", free_ids, 160, dict(temperature=0.8, seed=1))):
            plain = decode_run(model, ids, n_gen, False, **sampling)
            spec = decode_run(model, ids, n_gen, True, **sampling)
            assert spec[0] == plain[0], f"{name}: speculation changed the output"
            res.setdefault(f"{name} plain", []).append(plain[1])
            res.setdefault(f"{name} spec", []).append(spec[1])
            res.setdefault(f"{name} accepted", []).append(spec[2].accepted / max(1, len(spec[0])))
        plain = branches_run(model, branch_ids, 96, False)
        spec = branches_run(model, branch_ids, 96, True)
        assert spec[0] == plain[0], "branches: speculation changed the output"
        res.setdefault("branches plain", []).append(plain[1])
        res.setdefault("branches spec", []).append(spec[1])
        res.setdefault("branches accepted", []).append(spec[2] / max(1, sum(map(len, spec[0]))))
        if llama:  # in the same repetition: the machine's load is shared alike
            got = llama_run(args, model.path, edit_ids)
            for k, v in got.items():
                res.setdefault(f"llama {k}", []).extend(v)
    med = {k: statistics.median(v) for k, v in res.items()}
    for name in ("edit", "free", "branches"):
        print(f"  {name:<9} without {med[name + ' plain']:7.1f} tok/s   with {med[name + ' spec']:7.1f} tok/s   "
              f"{med[name + ' spec'] / med[name + ' plain']:.2f}x  ({med[name + ' accepted']:.0%} of tokens drafted right)")
    if llama:
        plain = med["llama 0"]
        best_k = max(("2", "10"), key=lambda k: med[f"llama {k}"])
        lookup = med[f"llama {best_k}"]
        print(f"  llama.cpp edit: without {plain:7.1f} tok/s   prompt lookup (num_pred_tokens={best_k}) "
              f"{lookup:7.1f} tok/s;  ours with speculation {med['edit spec'] / lookup:.2f}x theirs")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
