"""llama.cpp as an oracle: run one request through llama-cpp-python and write
what it computed. Needs only llama_cpp and numpy, so it runs in whichever
interpreter has them (the CI venv, or a venv of its own); the tests and
scripts/make_reference.py call it in a child process, so a llama.cpp that
dies (an AMX build on a guest without AMX: a general-protection fault)
takes down that child, not the test run.

    python scripts/llamacpp_oracle.py REQUEST.json OUT_DIR

REQUEST: {"model": path, "threads": 2, "n_batch": 512,
          "jobs": [{"kind": "info"} | {"kind": "bos"} |           # [BOS] where the model adds one, else []
                   {"kind": "tokenize", "texts": [...]} |
                   {"kind": "logits", "ids": [...]} |          # full vocabulary, every position
                   {"kind": "top", "ids": [...], "k": 40} |    # top-k log-probabilities, every position
                   {"kind": "greedy", "ids": [...], "n": 32}]}
OUT_DIR/result.json holds one entry per job; arrays go beside it as
job<i>_<name>.npy. Positions are evaluated in batches of n_batch, as
llama.cpp's own eval does (its Q4_K kernels round by a row's place in the
batch, so the batch size is part of the answer).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import llama_cpp

NO_OUTPUT = "llama.cpp's context keeps no logits"


def log_sum_exp(x: np.ndarray, rows: int = 64) -> np.ndarray:
    """Per row, in float64, a few rows at a time (a row of Gemma's is 262,144 logits)."""
    out = np.empty(len(x))
    for r in range(0, len(x), rows):
        part = x[r:r + rows].astype(np.float64)
        m = part.max(axis=1)
        out[r:r + rows] = m + np.log(np.exp(part - m[:, None]).sum(axis=1))
    return out


def info() -> dict:
    system = llama_cpp.llama_print_system_info().decode()
    return {"llama_cpp_python": llama_cpp.__version__, "system_info": system.strip()}


def open_model(req: dict, n_tokens: int) -> llama_cpp.Llama:
    return llama_cpp.Llama(req["model"], n_ctx=max(n_tokens + 8, 64), n_batch=req.get("n_batch", 512),
                           n_ubatch=req.get("n_batch", 512), n_threads=req.get("threads", 2),
                           n_threads_batch=req.get("threads", 2), logits_all=False, verbose=False)


def each_batch_logits(llm: llama_cpp.Llama, ids: list[int]):
    """Yield (start, logits[rows, n_vocab]) for every position, batch by batch."""
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    n_vocab = llm.n_vocab()
    for start in range(0, len(ids), llm.n_batch):
        part = ids[start:start + llm.n_batch]
        llm._batch.set_batch(batch=part, n_past=start, logits_all=True)
        llm._ctx.decode(llm._batch)
        ptr = llm._ctx.get_logits()
        if not ptr:
            raise RuntimeError(NO_OUTPUT)
        yield start, np.ctypeslib.as_array(ptr, shape=(len(part) * n_vocab,)).reshape(len(part), n_vocab).copy()
    llm.n_tokens = len(ids)


def run_job(llm: llama_cpp.Llama, job: dict, out: Path, i: int) -> dict:
    kind = job["kind"]
    if kind == "bos":
        return {"bos": [llm.token_bos()] if llm._model.add_bos_token() else []}
    if kind == "tokenize":
        return {"ids": [llm.tokenize(t.encode(), add_bos=False, special=False) for t in job["texts"]]}
    ids = job["ids"]
    if kind == "logits":
        rows = np.lib.format.open_memmap(out / f"job{i}_logits.npy", "w+", np.float32, (len(ids), llm.n_vocab()))
        for start, block in each_batch_logits(llm, ids):
            rows[start:start + len(block)] = block
        rows.flush()
        return {"logits": f"job{i}_logits.npy"}
    if kind == "top":
        k = job.get("k", 40)
        top_ids, top_lps = [], []
        for _, block in each_batch_logits(llm, ids):
            part = np.argpartition(-block, k - 1, axis=1)[:, :k]  # the k best, then only those sorted
            vals = np.take_along_axis(block, part, axis=1).astype(np.float64)
            order = np.lexsort((part, -vals), axis=1)
            top_ids.append(np.take_along_axis(part, order, axis=1).astype(np.int32))
            top_lps.append(np.take_along_axis(vals, order, axis=1) - log_sum_exp(block)[:, None])
        np.save(out / f"job{i}_top_ids.npy", np.concatenate(top_ids))
        np.save(out / f"job{i}_top_logprobs.npy", np.concatenate(top_lps))
        return {"top_ids": f"job{i}_top_ids.npy", "top_logprobs": f"job{i}_top_logprobs.npy"}
    if kind == "greedy":
        for _ in each_batch_logits(llm, ids):
            pass
        new: list[int] = []
        for _ in range(job["n"]):
            token = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))))
            if token == llm.token_eos():
                break
            new.append(token)
            llm._batch.set_batch(batch=[token], n_past=llm.n_tokens, logits_all=True)
            llm._ctx.decode(llm._batch)
            llm.n_tokens += 1
        return {"ids": new, "text": llm.detokenize(new).decode("utf-8", errors="replace")}
    raise ValueError(f"unknown job kind {kind!r}")


def main(argv: list[str]) -> int:
    request, out = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    longest = max([len(j.get("ids", [])) + j.get("n", 0) for j in request["jobs"]] + [0])
    llm = open_model(request, longest)
    results = [info() if job["kind"] == "info" else run_job(llm, job, out, i) for i, job in enumerate(request["jobs"])]
    llm.close()
    (out / "result.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
