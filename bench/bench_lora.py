"""Prefill and decode with a LoRA adapter against the base model, ours and
llama.cpp's, alternated in one run.

    python bench/bench_lora.py [--threads 2] [--rounds 5] [--prompt 512] [--gen 64] [--rank 16]
        [--dtype F32|F16|BF16|Q8_0] [--old-core OLD_CORE.so] [--llama-python /opt/llamavenv/bin/python]

The adapter (tests/lora_files.py smollm2_lora): rank 16 on every attention
and FFN matrix of the packaged SmolLM2 (7 matrices x 30 layers), f32 (or
``--dtype F16``; ``Q8_0``: A in Q8_0 and, unless the rank is a multiple of 32,
B in F16), as llama.cpp's convert_lora_to_gguf.py writes them. Each
round runs, each in a fresh process that warms up first: ours base, ours with
the adapter, the same with ``--old-core`` (another build's ``_core`` .so,
to compare a change), then llama.cpp base and with the adapter (loaded by
``Llama(lora_path=...)``).
Prefill: a 512-token prompt into an empty context; decode: 64 single-token
steps after a 16-token prompt. Medians over the rounds, ratios within the run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("prefill_tps", "decode_tps")


def interleaved(model: str, adapter: str, threads: int, rounds: int, n_prompt: int, n_gen: int) -> dict:
    """Ours with and without the adapter in one process, one engine, alternated every
    ``n_gen`` decode steps and every ``n_prompt``-token prefill (the order swapped each
    round), so the machine's drift falls on both alike: the per-pair ratios."""
    import numpy as np

    from ctxengine.engine.engine import Engine

    e = Engine(model, threads=threads)
    e.load_lora("a", adapter)
    sets = {"base": e.lora_set(None), "lora": e.lora_set({"a": 1.0})}
    ids = [int(i) for i in np.random.default_rng(0).integers(1000, 20000, n_prompt)]
    seqs = {k: e.new_sequence() for k in sets}
    last = {k: e.forward(seqs[k], ids[:16], lora=lo) for k, lo in sets.items()}  # warm, and a start to decode from
    ratios: dict[str, list[float]] = {"prefill": [], "decode": []}
    for r in range(rounds):
        took = {}
        for k in (("base", "lora") if r % 2 == 0 else ("lora", "base")):
            seq, lo = e.new_sequence(), sets[k]
            t0 = time.perf_counter()
            e.forward(seq, ids, lora=lo)
            t1 = time.perf_counter()
            for _ in range(n_gen):
                last[k] = e.forward(seqs[k], [int(np.argmax(last[k]))], lora=lo)
            took[k] = (t1 - t0, time.perf_counter() - t1)
            if seqs[k].n_tokens + n_gen >= e.config.n_ctx:
                seqs[k] = e.new_sequence()
                last[k] = e.forward(seqs[k], ids[:16], lora=lo)
        ratios["prefill"].append(took["base"][0] / took["lora"][0])
        ratios["decode"].append(took["base"][1] / took["lora"][1])
    return ratios


def measure(engine: str, model: str, adapter: str, threads: int, n_prompt: int, n_gen: int) -> dict:
    """One engine, with the adapter or without ("" ), in this process."""
    import numpy as np

    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(1000, 20000, n_prompt)]
    if engine == "ours":
        core = os.environ.get("CTX_BENCH_CORE")
        if core:  # --old-core: that build's native core in place of ours
            import importlib.util

            spec = importlib.util.spec_from_file_location("ctxengine._core", core)
            sys.modules["ctxengine._core"] = module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        from ctxengine import _core
        from ctxengine.engine.engine import Engine

        e = Engine(model, threads=threads)
        if adapter:
            e.load_lora("a", adapter)
        lora = e.lora_set({"a": 1.0} if adapter else None)
        forward = lambda seq, toks: e.forward(seq, toks, lora=lora)  # noqa: E731
        new_seq, isa = e.new_sequence, _core.active_isa()
    else:
        import llama_cpp

        m = llama_cpp.Llama(model, lora_path=adapter or None, n_threads=threads, n_threads_batch=threads,
                            n_batch=512, n_ubatch=512, n_ctx=n_prompt + n_gen + 64, logits_all=False, verbose=False)

        def forward(seq, toks):
            m.eval(toks)
            return np.asarray(m.scores[m.n_tokens - 1])

        def new_seq():
            m.reset()
        isa = llama_cpp.llama_print_system_info().decode()
    forward(new_seq(), ids[:32])  # warm up
    seq = new_seq()
    t0 = time.perf_counter()
    forward(seq, ids)
    pp = n_prompt / (time.perf_counter() - t0)
    seq = new_seq()
    logits = forward(seq, ids[:16])
    t0 = time.perf_counter()
    for _ in range(n_gen):
        logits = forward(seq, [int(np.argmax(logits))])
    return {"prefill_tps": pp, "decode_tps": n_gen / (time.perf_counter() - t0), "isa": isa}


def file_types(dtype: str, rank: int) -> str | tuple[str, str]:
    """The types convert_lora_to_gguf.py gives A and B: Q8_0 falls back to F16 for a
    B whose rows (the rank) are not whole blocks of 32."""
    return (dtype, "F16") if dtype == "Q8_0" and rank % 32 else dtype


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", choices=("F32", "F16", "BF16", "Q8_0"), default="F32",
                    help="the adapter file's matrices")
    ap.add_argument("--interleaved", action="store_true",
                    help="ours only, with and without the adapter alternated in one process (drift cancels)")
    ap.add_argument("--old-core", help="another build's _core .so, run alternated with ours (old, old+lora)")
    ap.add_argument("--llama-python", default=os.environ.get("CTX_LLAMA_PYTHON"))
    ap.add_argument("--child", nargs=3, metavar=("ENGINE", "MODEL", "ADAPTER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.threads, args.prompt, args.gen)))
        return 0
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from conftest import read_metadata, smollm2_file
    from ctxengine.bench.facts import describe_machine, machine_facts
    from lora_files import smollm2_lora

    model = str(smollm2_file())
    facts = machine_facts(args.threads)
    adapter = str(smollm2_lora(os.path.join(tempfile.mkdtemp(), "lora.gguf"), read_metadata(model), rank=args.rank,
                               dtype=file_types(args.dtype, args.rank)))
    if args.interleaved:
        ratios = interleaved(model, adapter, args.threads, args.rounds, args.prompt, args.gen)
        print(f"SmolLM2 Q4_1 + rank-{args.rank} {args.dtype.lower()} adapter, ours alternated in one process, "
              f"{args.threads} threads, {args.rounds} rounds of a {args.prompt}-token prefill and {args.gen} decode "
              f"steps each")
        print(describe_machine(facts))
        for k, rs in ratios.items():
            rs = sorted(rs)
            print(f"{k:>8}: lora/base by round: median {statistics.median(rs):.3f}x, quartiles "
                  f"{rs[len(rs) // 4]:.3f}-{rs[3 * len(rs) // 4]:.3f}, range {rs[0]:.3f}-{rs[-1]:.3f}")
        return 0
    runs = [("ours", sys.executable, ""), ("ours+lora", sys.executable, adapter)]
    if args.old_core:
        runs += [("old", sys.executable, ""), ("old+lora", sys.executable, adapter)]
    if args.llama_python:
        runs += [("llama.cpp", args.llama_python, ""), ("llama.cpp+lora", args.llama_python, adapter)]
    out: dict = {name: [] for name, _, _ in runs}
    for r in range(args.rounds):
        for name, python, ad in runs:
            engine = name.split("+")[0]
            cmd = [python, os.path.abspath(__file__), "--child", "ours" if engine == "old" else engine, model,
                   ad or "", "--threads", str(args.threads), "--prompt", str(args.prompt), "--gen", str(args.gen)]
            env = dict(os.environ, CTX_BENCH_CORE=os.path.abspath(args.old_core)) if engine == "old" else None
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"bench_lora: {name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
            out[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"SmolLM2 Q4_1 + rank-{args.rank} {args.dtype.lower()} adapter on every attention and FFN matrix; "
          f"{args.threads} threads; prompt {args.prompt}, gen {args.gen}; medians of {args.rounds} alternated rounds")
    print(describe_machine(facts))
    med = {name: {k: statistics.median(x[k] for x in rs) for k in KEYS} for name, rs in out.items()}
    for k in KEYS:
        line = f"{k:>12}: " + ", ".join(
            f"{name} {v[k]:.1f} ({min(x[k] for x in out[name]):.1f}-{max(x[k] for x in out[name]):.1f})"
            for name, v in med.items())
        per_round = sorted(x[k] / y[k] for x, y in zip(out["ours+lora"], out["ours"]))
        line += (f"; ours lora/base {med['ours+lora'][k] / med['ours'][k]:.2f}x (by round: median "
                 f"{statistics.median(per_round):.2f}x, {per_round[0]:.2f}-{per_round[-1]:.2f})")
        if "old" in med:
            line += (f", old lora/base {med['old+lora'][k] / med['old'][k]:.2f}x"
                     f", ours+lora / old+lora {med['ours+lora'][k] / med['old+lora'][k]:.2f}x")
        if "llama.cpp" in med:
            line += (f", llama.cpp lora/base {med['llama.cpp+lora'][k] / med['llama.cpp'][k]:.2f}x"
                     f", ours+lora / llama.cpp+lora {med['ours+lora'][k] / med['llama.cpp+lora'][k]:.2f}x")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
