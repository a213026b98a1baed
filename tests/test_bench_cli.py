"""`ctx bench --json` measures the real path and reports the keys issue 6 names."""
import json
import subprocess
import sys

import pytest


def test_ctx_bench_json_has_the_figures():
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "bench", "--reps", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prefill_tps"] > 0 and out["decode_tps"] > 0 and out["ttft_ms"] > 0
    assert set(out["batched_decode_tps"]) == {"1", "4", "8"}
    assert all(v > 0 for v in out["batched_decode_tps"].values())
    assert out["kv_dtype"] == "f16" and out["kv_bytes_per_token"] == 23040
    # The facts a figure needs beside it (issue 13): machine, SIMD path, bandwidth, bytes per token.
    from ctxengine import _core
    from ctxengine.engine.cpu import cpu_flags
    from ctxengine.engine.registry import resolve_model

    machine = out["machine"]
    assert machine["isa"] == _core.active_isa() and machine["threads"] == out["threads"]
    assert set(machine["simd_flags"]) <= cpu_flags() and not set(machine["missing_simd_flags"]) & cpu_flags()
    assert machine["cpu"] and machine["date"].endswith("UTC")
    assert out["read_bandwidth"] > 1e8  # bytes/s: any machine that runs the suite reads faster than 100 MB/s
    # SmolLM2 ties its embeddings: every tensor is read per token, so nearly the whole file.
    assert 0.9 * resolve_model(None).stat().st_size < out["weight_bytes_per_token"] < resolve_model(None).stat().st_size


@pytest.mark.parametrize("reps", ["0", "-2"])
def test_ctx_bench_needs_a_repetition_for_a_median(reps):
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "bench", "--reps", reps, "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and not r.stdout
    assert r.stderr == f"ctx bench: error: argument --reps: must be 1 or more, not {reps} (usage: ctx bench --help)\n"
