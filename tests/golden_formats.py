"""What the golden files of tests/data/formats/ were made from: shared by
scripts/make_golden_formats.py (which wrote them once) and
tests/test_golden_formats.py (which reads them with today's code).

Change nothing here that the files already on disk depend on: the tiny
Gemma 3 is rebuilt from this config and seed in every test run, and must
keep the weight id its snapshot was made with.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tiny_models import TinyConfig, make_weights, write_gguf

DIR = Path(__file__).resolve().parent / "data" / "formats"
STORE = DIR / "store"            # an LMDB snapshot store (data.mdb only)
EXPORT = DIR / "smollm2-q8.ctxsnap"  # a snapshot file, export format 1
EXPECTED = DIR / "expected.json"  # what the writer saw: ids, formats, weights, tokens

# A format-1 manifest: SmolLM2 (the packaged default), f16 KV, one page.
SMOLLM2_TEXT = "The capital of France is"
# The export file: SmolLM2 with q8 KV, another short text.
EXPORT_TEXT = "Snapshots outlive versions."
# A format-2 manifest: a tiny Gemma 3 (random weights, seed 0) whose 20-token
# sliding window releases pages of a 100-token context.
TINY_GEMMA3 = TinyConfig(arch="gemma3", n_layer=4, swa_window=20, swa_pattern=2, n_ctx=512)
TINY_GEMMA3_TOKENS = [int(t) for t in np.random.default_rng(7).integers(0, 256, 100)]


def write_tiny_gemma3(path: Path) -> Path:
    write_gguf(path, TINY_GEMMA3, make_weights(TINY_GEMMA3, seed=0))
    return path
