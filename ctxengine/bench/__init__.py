"""Measuring and proving: what ``ctx bench`` and ``ctx verify`` run, and what
the scripts in bench/ import. A library over the public face and the layers
below it; the CLI parses arguments and prints.

    speed.py        prefill, decode, batched decode, time to first token (ctx bench)
    llama.py        the same through llama-cpp-python; self-contained, loaded by path in another venv
    facts.py        what a figure needs beside it: machine, SIMD path, date, read bandwidth
    verify.py       ctx verify's checks, run against the plain way bit for bit
    verify_ways.py  the ways a prompt's logits are computed besides the plain one
"""
