"""Rendering a chat template: SmolLM2's own (the packaged model's), a system
message and 20 turns of 20 words, as every chat request renders it.

    python bench/bench_template.py [--rounds 7] [--renders 300]

To compare two builds of the package, run it under each with ``python -S``
and the tree first on the path (an editable install's finder wins otherwise):

    python -S -c "import sys; sys.path[:0] = ['TREE', 'SITE_PACKAGES']; \\
        sys.argv = ['bench_template.py']; exec(open('bench/bench_template.py').read())"

Prints the machine's facts and the median and minimum microseconds a render.
"""
from __future__ import annotations

import argparse
import statistics
import time

from ctxengine.bench.facts import describe_machine, machine_facts
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.engine.registry import resolve_model
from ctxengine.text.chat_template import ChatTemplate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--renders", type=int, default=300)
    args = p.parse_args()
    print(describe_machine(machine_facts(1)))
    with open_gguf(resolve_model(None), header_only=True) as f:
        template = ChatTemplate(f.get("tokenizer.chat_template"))
    messages = [{"role": "system", "content": "You are helpful."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " * 20} for i in range(20)]
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.renders):
            template.render(messages)
        times.append((time.perf_counter() - t0) / args.renders * 1e6)
    print(f"render of {len(messages)} messages: median {statistics.median(times):.1f} us, min {min(times):.1f} us")


if __name__ == "__main__":
    main()
