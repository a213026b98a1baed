"""bench/soak.py for one minute: one real `ctx serve` under 16 concurrent
clients of every dialect (the real openai, anthropic and ollama clients),
named contexts, Responses branches, JSON-schema replies and clients that go
away mid-stream. No request may fail, and once every action has deleted what
it made, `ctx gc` must bring the store back to where it started. (Memory over
ten minutes is the bench's to report: docs/PERFORMANCE.md.)"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import soak  # noqa: E402


def test_a_minute_of_mixed_load_fails_nothing_and_leaves_nothing(tmp_path):
    s = soak.soak(tmp_path, seconds=60, clients=16, threads=2, every=15, warmup=30, quiet=True)
    assert not s["errors"], (s["errors"], s["error_examples"])
    done = {action for action, lat in s["latency_s"].items() if lat["n"]}
    assert done >= {"openai_chat", "anthropic_messages", "ollama_chat", "json_reply"}, done
    assert s["rows"][-1]["RssAnon"] > 0
    assert s["store_after_gc"] == s["store_before"], (s["store_before"], s["store_after_gc"])
