"""`ctx bench --json` measures the real path and reports the keys issue 6 names."""
import json
import subprocess
import sys


def test_ctx_bench_json_has_the_figures():
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "bench", "--reps", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prefill_tps"] > 0 and out["decode_tps"] > 0 and out["ttft_ms"] > 0
    assert set(out["batched_decode_tps"]) == {"1", "4", "8"}
    assert all(v > 0 for v in out["batched_decode_tps"].values())
    assert out["kv_dtype"] == "f16" and out["kv_bytes_per_token"] == 23040
