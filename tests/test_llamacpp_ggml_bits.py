"""Our quantized matmuls against ggml's own vec_dot (bench/check_ggml_bits.py),
on every SIMD path this CPU has, for every quantized weight type ours reads:
bit for bit, except Q4_K and Q6_K, which follow llama.cpp's x86 gemms for
batches (Q4_K repacked, Q6_K tiled: what Gemma 3's prefill runs through) by
design and differ from vec_dot by float rounding only, within REPACK_BOUND.

The check runs in a child process: it loads llama-cpp-python's libggml-cpu.so
into the interpreter that holds ctxengine._core.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simd_paths import EVERY_PATH

CHECK = Path(__file__).resolve().parents[1] / "bench" / "check_ggml_bits.py"
REPACK_BOUND = 1e-7  # the bench's own: asserted here too so a change to one is a visible change


@pytest.fixture(scope="module")
def ggml_cpu(llamacpp) -> Path:
    return llamacpp.ggml_cpu_library()


@pytest.mark.parametrize("isa", EVERY_PATH)
def test_every_type_equals_ggml_vec_dot_or_the_repacked_order(isa, ggml_cpu):
    run = subprocess.run([sys.executable, str(CHECK), "--lib", str(ggml_cpu), "--isa", isa, "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr.strip().splitlines()[-1:]
    report = json.loads(run.stdout)
    print(f"{isa}: " + ", ".join(f"{t} {r['differ']}/{r['total']} differ (max rel {r['max_rel']:.2g})"
                                 for t, r in report.items()))
    assert "Q4_K" in report and "Q6_K" in report and len(report) == 10
    for name, r in report.items():
        if name in ("Q4_K", "Q6_K"):
            assert r["max_rel"] <= REPACK_BOUND, f"{name}: {r}"
        else:
            assert r["differ"] == 0, f"{name} on {isa}: {r['differ']} of {r['total']} differ (max rel {r['max_rel']:.2g})"
