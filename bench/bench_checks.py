"""What the load- and open-time integrity checks cost: the inf / NaN check of a
model's weights (engine/finite_weights.py, run with a file's first hashing)
beside the weight id's BLAKE3, and the B-tree walk a store gets before LMDB
opens it (store/lmdb_check.py, every open).

    python bench/bench_checks.py [--reps 9] [STORE ...]

The models are the packaged SmolLM2 and the test suite's Gemma 3 (tests/conftest.py
finds them); a STORE is a snapshot store's folder (one with data.mdb). Prints the
machine's facts and each step's median (and range) in milliseconds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from ctxengine.bench.facts import describe_machine, machine_facts
from ctxengine.engine.finite_weights import check_finite_weights
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.engine.weights import weight_id
from ctxengine.store.lmdb_check import check_file


def timed(fn, reps: int) -> str:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return f"{statistics.median(ts):.1f} ms ({min(ts):.1f}-{max(ts):.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("stores", nargs="*", help="snapshot store folders to walk")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import gemma3_file, smollm2_file

    print(describe_machine(machine_facts(1)))
    for name, path in (("SmolLM2 Q4_1", smollm2_file()), ("Gemma 3 Q4_K_M", gemma3_file())):
        with open_gguf(path) as f:
            print(f"{name}: inf/NaN check {timed(lambda: check_finite_weights(f), args.reps)}; "
                  f"weight id {timed(lambda: weight_id(f), max(1, args.reps // 2))}")
    for store in args.stores:
        print(f"{store}: B-tree walk {timed(lambda: check_file(str(Path(store) / 'data.mdb')), args.reps)}")


if __name__ == "__main__":
    main()
