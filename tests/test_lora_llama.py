"""SmolLM2 with a rank-16 adapter on every attention and FFN matrix, against
llama.cpp loading the same adapter file (its outputs recorded by
scripts/lora_reference.py in tests/data/lora_smollm2_llama.json)."""
import json
from pathlib import Path

import numpy as np
import pytest

from ctxengine.engine.engine import Engine
from ctxengine.engine.lora import file_id
from lora_files import smollm2_lora

DATA = Path(__file__).parent / "data" / "lora_smollm2_llama.json"


@pytest.fixture(scope="module")
def reference():
    return json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def engine(smollm2_path):
    e = Engine(smollm2_path, threads=2)
    yield e
    e.close()


def test_adapter_matches_llama_cpp(tmp_path, engine, smollm2_meta, reference):
    path = smollm2_lora(tmp_path / "lora.gguf", smollm2_meta)
    assert file_id(path) == reference["adapter_blake3"], "the test adapter is no longer the file llama.cpp read"
    engine.load_lora("ref", path)
    lora = engine.lora_set({"ref": 1.0})
    agree, gaps, moved = [], [], []
    for ids, ref in zip(reference["ids"], reference["llama"]):
        ours = engine.logprobs(ids, top=5, lora=lora)
        base = engine.logprobs(ids, top=5)
        ref_top = np.array(ref["top_ids"])[:, 0]
        agree += list(ours.top_ids[:, 0] == ref_top)
        moved += list(base.top_ids[:, 0] != ref_top)
        # our log p of llama.cpp's top token, against llama.cpp's
        for row, (tid, tlp) in enumerate(zip(ref_top, np.array(ref["top_logprobs"])[:, 0])):
            hit = np.flatnonzero(ours.top_ids[row] == tid)
            if len(hit):
                gaps.append(abs(float(ours.top_logprobs[row, hit[0]]) - tlp))
    top1, gap = float(np.mean(agree)), float(np.mean(gaps))
    print(f"top-1 agreement {top1:.3f} over {len(agree)} positions; mean |d log p| {gap:.2e}; "
          f"the adapter changed llama.cpp's top-1 at {np.mean(moved):.2f} of positions")
    assert top1 >= 0.97 and gap < 0.05 and len(gaps) >= 0.95 * len(agree)
    assert np.mean(moved) > 0.05  # the adapter matters: the base model alone would not pass
