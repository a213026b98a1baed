"""The SIMD paths of the native kernels, for tests that run each one.

EVERY_PATH parametrizes over all three; a path this CPU cannot run is a skip
that names what the CPU lacks (so pytest's summary counts it), not a test
that silently was never generated. AVAILABLE is what this CPU runs.
"""
import pytest

from ctxengine import _core
from ctxengine.engine.cpu import cpu_flags

PATHS = ["scalar", "avx2", "avx512"]
AVAILABLE = PATHS[: PATHS.index(_core.detect_isa()) + 1]


def why_untested(path: str) -> str:
    lacks = [cpu for _, cpu in _core.isa_features(path) if cpu not in cpu_flags()]
    return f"the {path} path is not tested: this CPU lacks {', '.join(lacks)} (Debian has no Intel SDE to emulate it)"


EVERY_PATH = [pytest.param(p, id=p) if p in AVAILABLE else pytest.param(p, id=p, marks=pytest.mark.skip(why_untested(p)))
              for p in PATHS]
# The AVX2 path's prefill has a second build for CPUs with AVX-VNNI (the same bits);
# on_each_path (test_kernels.py) runs both where this CPU has it.
HAS_AVX_VNNI = "avx_vnni" in cpu_flags()
