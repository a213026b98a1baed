"""llama.cpp's teacher-forced outputs on SmolLM2 with the test adapter
(tests/lora_files.py smollm2_lora), for tests/test_lora_llama.py.

    python scripts/lora_reference.py [--llama-python /opt/llamavenv/bin/python] [--reference FILE]

writes tests/data/lora_smollm2_llama.json: for each reference text, the ids,
and per position llama.cpp's top 5 next tokens and their log-probabilities,
with the adapter file's BLAKE3 (the test rebuilds the file and checks it).
llama.cpp runs in a subprocess of the Python that has llama-cpp-python.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

# Runs under llama-cpp-python's Python: argv = model, adapter, ids json; prints the top 5 per position.
LLAMA = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
model, adapter, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = Llama(model_path=model, lora_path=adapter or None, n_ctx=512, n_threads=2, logits_all=True, verbose=False)
out = []
for seq in ids:
    llm.reset()
    llm.eval(seq)
    logits = np.array(llm.scores[: len(seq)], dtype=np.float64)
    lp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    top = np.argsort(-lp, axis=1, kind="stable")[:, :5]
    out.append({"top_ids": top.tolist(), "top_logprobs": np.take_along_axis(lp, top, 1).tolist()})
print(json.dumps(out))
"""


def llama_top(python: str, model: Path, adapter: Path | None, ids: list[list[int]]) -> list[dict]:
    run = subprocess.run([python, "-c", LLAMA, str(model), str(adapter or ""), json.dumps(ids)],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def main() -> None:
    from conftest import read_metadata, smollm2_file
    from ctxengine.engine.lora import file_id
    from lora_files import SMOLLM2_LORA, smollm2_lora

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", default="/opt/llamavenv/bin/python")
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "smollm2-135m-q4_1.json",
                    help="llama.cpp's SmolLM2 reference outputs, whose teacher-forced token ids are used")
    args = ap.parse_args()
    model = smollm2_file()
    ref = json.loads(args.reference.read_text())
    ids = [t["ids"] for t in ref["teacher"]]
    with tempfile.TemporaryDirectory() as tmp:
        adapter = smollm2_lora(Path(tmp) / "lora.gguf", read_metadata(model))
        result = {"adapter": SMOLLM2_LORA, "adapter_blake3": file_id(adapter), "ids": ids,
                  "llama": llama_top(args.llama_python, model, adapter, ids)}
    out = REPO / "tests" / "data" / "lora_smollm2_llama.json"
    out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
