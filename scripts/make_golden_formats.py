"""Write tests/data/formats/: golden files of the store's released formats.

    python scripts/make_golden_formats.py [--out DIR]

Run ONCE per new format, into a new folder: files already in tests/data/ are
what every later version must keep reading, so they are never regenerated
(the script refuses a folder that exists). What it writes, with today's code:

* store/data.mdb: an LMDB snapshot store (a compact copy, no lock file) with
  ref ``smollm2-f16`` (SmolLM2, f16 KV: a format-1 manifest) and ref
  ``tiny-gemma3`` (a tiny random-weight Gemma 3 whose sliding window released
  pages: a format-2 manifest);
* smollm2-q8.ctxsnap: a snapshot file (export format 1) of SmolLM2 with q8 KV;
* expected.json: each snapshot's id, manifest format, weight id, KV dtype,
  tokens, and the ctxengine that wrote them.

The inputs (texts, the tiny model's config and seed) are tests/golden_formats.py's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import golden_formats as g  # noqa: E402  (the tests' own record of the inputs)

import ctxengine as ce  # noqa: E402


def snapshot_of(model, store, text_or_ids, ref: str) -> dict:
    """Snapshot a new context holding ``text_or_ids`` under ``ref``; what expected.json records of it."""
    ctx = model.context(None)
    ctx.append(text_or_ids)
    sid = ctx.snapshot(store, ref=ref)
    m = store.get_manifest(sid)
    assert m.n_tokens == len(m.token_ids) == len(ctx.tokens), "a golden snapshot holds the KV of every token"
    ctx.delete()
    return {"snapshot_id": sid, "format_version": m.format_version, "weight_id": m.weight_id,
            "model_name": m.model_name, "kv_dtype": m.kv_dtype, "token_ids": m.token_ids,
            "released_pages": m.released_pages, "n_pages": len(m.page_keys)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=g.DIR)
    out = p.parse_args().out
    if out.exists():
        sys.exit(f"{out} exists: golden files are never regenerated; write a new format into a new folder")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        refs = {}
        with ce.Store(tmp / "store") as store:
            smollm2 = ce.load(None, threads=1)
            refs["smollm2-f16"] = snapshot_of(smollm2, store, g.SMOLLM2_TEXT, "smollm2-f16")
            smollm2.close()
            gemma = ce.load(g.write_tiny_gemma3(tmp / "tiny-gemma3.gguf"), threads=1)
            refs["tiny-gemma3"] = snapshot_of(gemma, store, g.TINY_GEMMA3_TOKENS, "tiny-gemma3")
            gemma.close()
            assert [r["format_version"] for r in refs.values()] == [1, 2]
            (out / "store").mkdir(parents=True)
            store.env.env.copy(str(out / "store"), compact=True)
        with ce.Store(tmp / "q8") as store:
            q8 = ce.load(None, threads=1, kv="q8")
            export = snapshot_of(q8, store, g.EXPORT_TEXT, "smollm2-q8")
            q8.close()
            store.export("smollm2-q8", out / g.EXPORT.name)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    written = {"by": f"ctxengine {ce.__version__}, commit {commit.strip()}",
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    (out / g.EXPECTED.name).write_text(json.dumps({"written": written, "store": refs, "export": export}, indent=1) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{f.relative_to(out)} {f.stat().st_size // 1024} KiB"
                                      for f in sorted(out.rglob("*")) if f.is_file()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
