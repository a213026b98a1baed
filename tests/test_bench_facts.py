"""bench_facts: bytes of weights a decode step reads, and the read-bandwidth probe."""
from tiny_models import TinyConfig, make_weights, write_gguf

from ctxengine.bench.facts import read_bandwidth, round_order, weight_bytes_per_token


def test_weight_bytes_count_one_embedding_row_unless_the_embeddings_are_the_output(tmp_path):
    for tied in (True, False):
        cfg = TinyConfig(tied=tied)
        w = write_gguf(tmp_path / f"m{tied}.gguf", cfg, make_weights(cfg))
        total = sum(a.nbytes for a in w.values())
        embd = w["token_embd.weight"]
        expected = total if tied else total - embd.nbytes + embd.nbytes // embd.shape[0]
        assert weight_bytes_per_token(tmp_path / f"m{tied}.gguf") == expected


def test_the_probe_reports_a_plausible_rate_for_one_and_two_threads():
    for threads in (1, 2):
        assert 1e8 < read_bandwidth(threads, reps=1) < 1e13  # 100 MB/s .. 10 TB/s


def test_each_item_opens_a_round_in_turn():
    items = ["ours", "llama.cpp", "ik"]
    orders = [round_order(items, r) for r in range(4)]
    assert orders == [items, ["llama.cpp", "ik", "ours"], ["ik", "ours", "llama.cpp"], items]
    assert round_order([], 3) == []
