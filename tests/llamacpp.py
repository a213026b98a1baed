"""llama.cpp, live, for the anchor tests: runs scripts/llamacpp_oracle.py in a
child process of an interpreter that has llama-cpp-python.

Which interpreter: $CTX_LLAMACPP_PYTHON if set (.ci/run builds one in
.venv-llamacpp), else this one if it can import llama_cpp. Without either the
live tests skip with that reason, so the README's test command passes on a
bare machine; with CTX_REQUIRE_LLAMACPP=1 (set by .ci/run) the skip is a
failure instead, so CI cannot pass without having compared.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ORACLE = Path(__file__).resolve().parents[1] / "scripts" / "llamacpp_oracle.py"
MATMULS = ORACLE.with_name("llamacpp_matmuls.py")
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")


def unavailable(reason: str):
    if os.environ.get("CTX_REQUIRE_LLAMACPP") == "1":
        pytest.fail(f"CTX_REQUIRE_LLAMACPP=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def find_python() -> str | None:
    explicit = os.environ.get("CTX_LLAMACPP_PYTHON")
    if explicit:
        return explicit
    return sys.executable if importlib.util.find_spec("llama_cpp") is not None else None


def cpu_flags() -> set[str]:
    return set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()


def crash_reason(code: int, stderr: str, flags: set[str] | None = None) -> str:
    """One line on why the child died; an AMX guest fault is named as such."""
    what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    line = f"llama.cpp's child process died ({what}): {stderr.strip().splitlines()[-1] if stderr.strip() else ''}"
    amx = [f for f in AMX_FLAGS if f in (cpu_flags() if flags is None else flags)]
    if code < 0 and amx:
        line += (f"; this CPU lists {', '.join(amx)}, and a llama.cpp built with GGML_NATIVE=ON uses AMX, which "
                 "a guest that does not enable it answers with a general-protection fault: rebuild llama-cpp-python "
                 "with CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX512=ON ... -DGGML_AMX_TILE=OFF' (see .ci/run)")
    return line


# What an AVX2-only build of llama.cpp computes differently from the AVX-512 build whose
# numerics our canonical order follows (found on an AMD Zen 3 without AVX-512, session 31, by
# overwriting the four results below with the AVX-512 arithmetic: the AVX2 build then met the
# stored reference to 5e-6, against 0.46-1.2 in log-probability before).
AVX2_BUILD_DIFFERS = (
    "this llama.cpp is an AVX2 build (its system info has no AVX512 = 1), and its numerics are not the AVX-512 "
    "build's, which our canonical order follows on every path and the stored reference records: ggml's AVX2 "
    "ggml_v_expf rounds differently (fma(j, k, k) where AVX-512 has scalef(fma(c1, b, 1))) in SwiGLU's SiLU and "
    "the softmax, whose sum and the f16 attention matmuls (llamafile_sgemm's tinyBLAS<8> against <16>) add in "
    "another order. Each moves a last bit; Q8_1's rounding of the next matmul's input turns some of those into "
    "whole steps, and 30 layers into log-probability gaps up to 0.5-1.2. Compared with the stored reference instead"
)


def is_avx512_build(oracle) -> bool:
    """Whether this llama.cpp computes as the AVX-512 build does (its system info says so)."""
    return "AVX512 = 1" in oracle.info["system_info"]


def require_avx512_build(oracle) -> None:
    """Skip a comparison that holds llama.cpp to our bits (or near them) unless this llama.cpp
    computes as the AVX-512 build does."""
    if not is_avx512_build(oracle):
        pytest.skip(AVX2_BUILD_DIFFERS)


class LlamaCpp:
    """One llama-cpp-python interpreter; each run() is one child process."""

    def __init__(self, python: str):
        self.python = python

    def ggml_cpu_library(self) -> Path:
        """The libggml-cpu.so that this llama-cpp-python loads."""
        where = subprocess.run([self.python, "-c", "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return next(Path(where).glob("lib/libggml-cpu*.so"))

    def child(self, script: Path, request: dict, out: Path) -> None:
        """Run one of the scripts/llamacpp_*.py on request, writing into out."""
        (out / "request.json").write_text(json.dumps(request))
        child = subprocess.run([self.python, str(script), str(out / "request.json"), str(out)],
                               capture_output=True, text=True, timeout=1800)
        if child.returncode != 0:
            raise RuntimeError(crash_reason(child.returncode, child.stderr))

    def matmuls(self, model: Path, ids: list[int], *, threads: int = 2) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{weight name: (x, y)}: each quantized matmul llama.cpp runs on ids as one batch
        (scripts/llamacpp_matmuls.py), its float input and its output."""
        with tempfile.TemporaryDirectory(prefix="llamacpp-") as tmp:
            out = Path(tmp)
            self.child(MATMULS, {"model": str(model), "ids": ids, "threads": threads}, out)
            with np.load(out / "matmuls.npz") as z:
                return {k[:-2]: (z[k], z[k[:-2] + ":y"]) for k in z.files if k.endswith(":x")}

    def run(self, model: Path, jobs: list[dict], *, threads: int = 2, n_batch: int = 512) -> list[dict]:
        with tempfile.TemporaryDirectory(prefix="llamacpp-") as tmp:
            out = Path(tmp)
            self.child(ORACLE, {"model": str(model), "threads": threads, "n_batch": n_batch, "jobs": jobs}, out)
            results = json.loads((out / "result.json").read_text())
            for r in results:
                for key, value in list(r.items()):
                    if isinstance(value, str) and value.endswith(".npy"):
                        r[key] = np.load(out / value)
            return results


def open_llamacpp() -> LlamaCpp:
    python = find_python()
    if python is None:
        unavailable("llama.cpp is not importable here (pip install llama-cpp-python==0.3.36, "
                    "or set CTX_LLAMACPP_PYTHON to a python that has it)")
    try:
        probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, text=True)
    except OSError as err:
        unavailable(f"{python} cannot import llama_cpp: it does not run ({err.strerror})")
    if probe.returncode != 0:
        unavailable(f"{python} cannot import llama_cpp: {probe.stderr.strip().splitlines()[-1:]}")
    return LlamaCpp(python)
