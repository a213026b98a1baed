"""CPU-time rates of one thread with and without a LoRA adapter, for a machine
too loaded for wall-clock figures: process CPU seconds do not count the time
other processes hold the cores (a pool of 1 thread has no spinning to count).

    python bench/lora_cpu_rates.py MODE ADAPTER [--core OTHER_CORE.so]

MODE: decode (200 single-token steps after 16 tokens) or prefill (512 tokens);
ADAPTER: an adapter .gguf (made with tests/lora_files.py smollm2_lora if absent,
f16 when its name has "16") or "-" for the base model. Prints one JSON line;
run it alternated (old and new core, base and adapters) and take medians.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_engine(adapter: str, core: str | None = None):
    """SmolLM2 on one thread, with ``core`` in place of our _core, and the
    adapter (made if absent; "-": none); returns the engine and its LoraSet."""
    if core:
        spec = importlib.util.spec_from_file_location("ctxengine._core", core)
        sys.modules["ctxengine._core"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from conftest import read_metadata, smollm2_file
    from ctxengine.engine.engine import Engine
    from lora_files import smollm2_lora

    model = smollm2_file()
    e = Engine(model, threads=1)
    if adapter != "-":
        if not os.path.exists(adapter):
            smollm2_lora(adapter, read_metadata(model), dtype="F16" if "16" in os.path.basename(adapter) else "F32")
        e.load_lora("a", adapter)
    return e, e.lora_set({"a": 1.0} if adapter != "-" else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("decode", "prefill"))
    ap.add_argument("adapter")
    ap.add_argument("--core", help="another build's _core .so in place of ours")
    args = ap.parse_args()
    e, lora = load_engine(args.adapter, args.core)
    seq = e.new_sequence()
    e.forward(seq, list(range(1000, 1016)), lora=lora)  # warm up
    c0 = time.process_time()
    if args.mode == "decode":
        for i in range(200):
            e.forward(seq, [2000 + i], lora=lora)
        n = 200
    else:
        e.forward(e.new_sequence(), list(range(1000, 1512)), lora=lora)
        n = 512
    print(json.dumps({"core": args.core or "ours", "adapter": args.adapter, "mode": args.mode,
                      "cpu_tps": n / (time.process_time() - c0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
