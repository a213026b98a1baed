"""Pull throughput from loopback servers against curl of the same file, same run (issue 23).

    python bench/bench_pull.py [--rounds 3] [--pad-mb 512] [--json]

The loopback Hub and Ollama registry of the tests (tests/hub_servers.py)
serve the packaged Gemma 3 270M Q4_K_M (253 MB) followed by --pad-mb MiB of
random bytes, which GGUF readers never reach (they read the tensors the
header places, all before it): a file large enough that the transfer, not
the start of a Python process, sets the end-to-end time. Each round, alternated:
`curl -L` of the registry's blob URL, `ctx pull ollama://gemma3:270m` (the
registry protocol, sha256 checked as the bytes arrive, into a fresh store),
`curl -L` of the Hub's resolve/ URL, `ctx pull hf://...:Q4_K_M` (through
huggingface_hub into a fresh cache, sha256 checked as written). Both pulls
run as `ctx pull` child processes, as a user runs them: their wall time
includes starting Python, imports, the manifest or model_info request and
the model's header check; "its transfer" is the time the pull itself reports
for moving and checking the bytes. curl writes to the same filesystem.
Each row also gives the median CPU seconds (user + system) of the process,
which a busy machine does not change as much as the wall time. Then the resume: a pull killed after about 40% of the file,
pulled again; the bytes the second pull fetched, counted by the server.
Goal: each pull >= 0.8x curl's throughput.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests")]  # the loopback servers and the pull helpers of the tests

from conftest import gemma3_file, smollm2_file  # noqa: E402
from pull_fixtures import GEMMA_REPO, kill_halfway, make_hub, make_registry, pull  # noqa: E402


# A pull's Python as an installed package runs it: with its modules' bytecode cached (pip
# writes it at install). A shell that sets PYTHONDONTWRITEBYTECODE (this project's machines
# do) would otherwise have every run of the editable checkout compile its modules again.
AS_INSTALLED = {"PYTHONDONTWRITEBYTECODE": ""}


def padded(model: Path, out: Path, pad: int) -> Path:
    """A copy of model with pad random bytes after it (1 MiB of them, repeated)."""
    shutil.copyfile(model, out)
    block = random.Random(23).randbytes(1 << 20)
    with open(out, "ab") as f:
        for start in range(0, pad, len(block)):
            f.write(block[:pad - start])
    return out


def children_cpu() -> float:
    """CPU seconds (user + system) of the children that have ended so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_run(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of a command."""
    t0, c0 = time.perf_counter(), children_cpu()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0, children_cpu() - c0


def timed_pull(spec: str, home: Path, env: dict) -> tuple[float, float, float]:
    """(wall seconds of `ctx pull`, its CPU seconds, seconds it says it spent moving and checking the bytes)."""
    t0, c0 = time.perf_counter(), children_cpu()
    r = pull(spec, home=home, env=env)
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    m = re.search(r"fetched in ([0-9.]+) s", r.stderr)
    if r.returncode != 0 or m is None:
        raise SystemExit(r.stderr)
    return wall, cpu, float(m[1])


def rounds(n: int, tmp: Path, hub, registry, blob_url: str, hub_url: str) -> tuple[dict, dict]:
    """Seconds and CPU seconds of each, alternated, n rounds."""
    times: dict[str, list[float]] = {k: [] for k in (
        "curl registry", "ctx pull ollama://", "  its transfer", "curl hub", "ctx pull hf://", "  its transfer ")}
    cpu: dict[str, list[float]] = {k: [] for k in ("curl registry", "ctx pull ollama://", "curl hub", "ctx pull hf://")}
    for _ in range(n):
        # (curl's row, its URL, the pull's row, the pull's transfer row, what it pulls), in this order each round
        for curl, url, name, moved, spec in (
                ("curl registry", blob_url, "ctx pull ollama://", "  its transfer", "ollama://gemma3:270m"),
                ("curl hub", hub_url, "ctx pull hf://", "  its transfer ", f"hf://{GEMMA_REPO}:Q4_K_M")):
            with _clean(tmp) as work:
                wall, used = timed_run(["curl", "-sfL", "-o", str(work / "file"), url])
            times[curl].append(wall)
            cpu[curl].append(used)
            with _clean(tmp) as work:
                env = {"CTX_OLLAMA_REGISTRY": registry.url, "HF_ENDPOINT": hub.url, "HF_HOME": str(work / "hf"),
                       "HF_TOKEN": "", **AS_INSTALLED}
                wall, used, moving = timed_pull(spec, work / "home", env)
            times[name].append(wall)
            cpu[name].append(used)
            times[moved].append(moving)
    return times, cpu


@contextlib.contextmanager
def _clean(tmp: Path):
    """An empty folder for one download, deleted after it and everything on disk synced
    before it: on this machine's disk a write into space freed a moment ago costs a third
    of one into fresh space, and dirty pages left by the last download would be written
    back while this one runs, so each download starts from the same state."""
    work = tmp / "download"
    work.mkdir()
    os.sync()
    try:
        yield work
    finally:
        shutil.rmtree(work)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pad-mb", type=int, default=512, help="MiB of trailing bytes after the model (0: the model alone)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from ctxengine.bench.facts import describe_machine, machine_facts

    smol = smollm2_file()
    with tempfile.TemporaryDirectory(prefix="bench-pull-") as tmp:
        tmp = Path(tmp)
        gemma = padded(gemma3_file(), tmp / "gemma-3-270m-it-Q4_K_M.gguf", args.pad_mb << 20)
        size = gemma.stat().st_size
        (tmp / "README.md").write_text("# models\n")
        hub = make_hub(smol, gemma, [], tmp / "README.md")
        registry = make_registry(tmp / "registry", smol, gemma)
        blob = next(p for p in (tmp / "registry" / "blobs").iterdir() if p.stat().st_size == size).name
        blob_url = f"{registry.url}/v2/library/gemma3/blobs/{blob.replace('-', ':', 1)}"
        hub_url = f"{hub.url}/{GEMMA_REPO}/resolve/main/gemma-3-270m-it-Q4_K_M.gguf"
        times, cpu = rounds(args.rounds, tmp, hub, registry, blob_url, hub_url)
        resume = _resume(tmp / "resume", registry, size)
        hub.close()
        registry.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"machine": machine_facts(threads=2), "bytes": size, "pad_bytes": args.pad_mb << 20, "rounds": args.rounds,
           "seconds": times, "cpu_seconds": cpu, "median_mb_s": {k: size / v / 1e6 for k, v in med.items()},
           "ratio_ollama_to_curl": med["curl registry"] / med["ctx pull ollama://"],
           "ratio_ollama_transfer_to_curl": med["curl registry"] / med["  its transfer"],
           "ratio_hf_to_curl": med["curl hub"] / med["ctx pull hf://"],
           "ratio_hf_transfer_to_curl": med["curl hub"] / med["  its transfer "], "resume": resume}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(describe_machine(out["machine"]))
    print(f"{size / 1e6:.1f} MB (the model and {args.pad_mb} MiB after it), {args.rounds} rounds alternated; "
          "median MB/s (min-max s):")
    for k, v in times.items():
        used = f"  CPU {statistics.median(cpu[k]):.2f} s" if k in cpu else ""
        print(f"  {k:<20} {out['median_mb_s'][k]:8.0f} MB/s  ({min(v):.2f}-{max(v):.2f} s){used}")
    print(f"  ollama:// / curl  {out['ratio_ollama_to_curl']:.2f}x (transfer {out['ratio_ollama_transfer_to_curl']:.2f}x)"
          f"    hf:// / curl  {out['ratio_hf_to_curl']:.2f}x (transfer {out['ratio_hf_transfer_to_curl']:.2f}x)")
    print(f"resume after a kill at {resume['kept'] / 1e6:.1f} MB: the second pull fetched "
          f"{resume['fetched'] / 1e6:.1f} MB of {size / 1e6:.1f} MB ({resume['saved'] / 1e6:.1f} MB saved)")
    return 0


def _resume(home: Path, registry, size: int) -> dict:
    env = {"CTX_OLLAMA_REGISTRY": registry.url}
    registry.rate = 60e6
    try:
        kept = kill_halfway("ollama://gemma3:270m", "ollama/blobs/*-partial", home, home=home, env=env,
                            at=int(size * 0.4))
    finally:
        registry.rate = None
    before = registry.sent
    r = pull("ollama://gemma3:270m", home=home, env=env)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    fetched = registry.sent - before
    return {"kept": kept, "fetched": fetched, "saved": size - fetched}


if __name__ == "__main__":
    sys.exit(main())
