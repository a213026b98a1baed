"""`ctx verify` proves determinism on this machine: every check bit-identical, exit 0."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("kv", ["f16", "q8"])
def test_ctx_verify_passes_and_prints_its_table(kv):
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "verify", "-t", "2", "--kv", kv],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f" {kv} KV " in r.stdout.splitlines()[0]
    for check in ("threads vs 1", "token by token", "uneven chunks", "batch of 8", "forked", "snapshot-restored",
                  "speculative vs plain"):
        line = next(l for l in r.stdout.splitlines() if check in l)
        assert "bit-identical" in line and "MISMATCH" not in line, line
    assert r.stdout.strip().endswith("all identical")


def test_ctx_verify_gemma3_with_its_sliding_window(gemma3_path):
    """Gemma 3: the last prompt runs past the 512-token window, so the fork and
    restore checks go through released pages."""
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "verify", "-t", "2", "-m", str(gemma3_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sliding window 512" in r.stdout.splitlines()[0]
    assert r.stdout.strip().endswith("all identical")
