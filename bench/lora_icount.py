"""The forward passes of a short decode with or without a LoRA adapter, for
counting their instructions under callgrind (repeatable under any load):

    valgrind --tool=callgrind --collect-atstart=no '--toggle-collect=ctx::Model::forward*' \\
        python bench/lora_icount.py ADAPTER [--core OTHER_CORE.so] [--steps 8]

ADAPTER: an adapter .gguf (made with tests/lora_files.py smollm2_lora if absent,
f16 when its name has "16") or "-" for the base model. One thread, a 4-token
prompt, then ``--steps`` single-token steps; callgrind_annotate on the output
splits the count by kernel. Valgrind has no AVX-512, so this counts the AVX2 path.
"""
from __future__ import annotations

import argparse
import sys

from lora_cpu_rates import load_engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapter")
    ap.add_argument("--core", help="another build's _core .so in place of ours")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    e, lora = load_engine(args.adapter, args.core)
    seq = e.new_sequence()
    e.forward(seq, list(range(1000, 1004)), lora=lora)
    for i in range(args.steps):
        e.forward(seq, [2000 + i], lora=lora)
    return 0


if __name__ == "__main__":
    sys.exit(main())
