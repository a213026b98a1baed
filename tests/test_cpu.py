"""The SIMD path chosen at run time: only one whose every compiled-in feature the CPU has."""
import re
from pathlib import Path

import pytest

from ctxengine import _core
from ctxengine.engine.cpu import cpu_flags

REPO = Path(__file__).resolve().parents[1]
PATHS = ["scalar", "avx2", "avx512"]


def cmake_flags(path: str) -> set[str]:
    """The -m flags CMakeLists.txt compiles the *_<path>.cpp files with."""
    text = (REPO / "CMakeLists.txt").read_text()
    m = re.search(r'_%s\\\\\.cpp\$"\)\s*set_source_files_properties\([^)]*COMPILE_OPTIONS\s*"([^"]*)"' % path, text)
    assert m, f"no COMPILE_OPTIONS for *_{path}.cpp in CMakeLists.txt"
    return {opt[2:] for opt in m.group(1).split(";") if opt.startswith("-m")}


@pytest.mark.parametrize("path", ["avx2", "avx512"])
def test_each_path_checks_every_feature_its_files_are_compiled_with(path):
    assert {compiler for compiler, _ in _core.isa_features(path)} == cmake_flags(path)


def test_the_chosen_path_has_all_its_flags_in_proc_cpuinfo():
    flags = cpu_flags()
    assert "fpu" in flags, "no flags read from /proc/cpuinfo"
    chosen = _core.detect_isa()
    missing = [cpu for _, cpu in _core.isa_features(chosen) if cpu not in flags]
    assert not missing, f"{chosen} chosen but /proc/cpuinfo lacks {missing}"
    assert _core.active_isa() == chosen  # nothing forced a path at import


def test_the_best_path_this_cpu_has_is_chosen():
    flags = cpu_flags()
    has = [p for p in PATHS if all(cpu in flags for _, cpu in _core.isa_features(p))]
    assert _core.detect_isa() == has[-1]


def test_a_path_beyond_the_cpu_is_refused_and_names_are_checked():
    with pytest.raises(ValueError, match="unknown ISA"):
        _core.isa_features("neon")
    above = PATHS[PATHS.index(_core.detect_isa()) + 1:]
    for path in above:
        with pytest.raises(ValueError, match="does not support"):
            _core.set_isa(path)
    assert _core.isa_features("scalar") == []


def cpuinfo_field(name: str) -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def test_the_prefill_tile_form_follows_the_cpu():
    """zmm tiles (two pairs a register) where 512-bit operations run whole,
    ymm on AMD before Zen 5 (family 26), which splits them, and where there
    are none; either can be forced, and both give the same bits
    (tests/test_kernels.py)."""
    split = cpuinfo_field("vendor_id") == "AuthenticAMD" and int(cpuinfo_field("cpu family")) < 26
    whole = "avx512f" in cpu_flags() and not split
    assert _core.quant.prefill_tiles() == ("zmm" if whole else "ymm")
    before = _core.quant.prefill_tiles()
    try:
        for tiles in ("ymm", "zmm"):
            _core.quant.set_prefill_tiles(tiles)
            assert _core.quant.prefill_tiles() == tiles
        with pytest.raises(ValueError, match="'ymm' or 'zmm'"):
            _core.quant.set_prefill_tiles("xmm")
    finally:
        _core.quant.set_prefill_tiles(before)


def test_the_avx2_prefill_takes_avx_vnni_where_the_cpu_has_it():
    """AVX-VNNI's vpdpbusd where /proc/cpuinfo says avx_vnni; it can be turned off, and
    on only where the CPU has it (tests/test_kernels.py compares the bits of both)."""
    has = "avx_vnni" in cpu_flags()
    assert _core.quant.avx2_vnni() == has
    try:
        _core.quant.set_avx2_vnni(False)
        assert not _core.quant.avx2_vnni()
        if has:
            _core.quant.set_avx2_vnni(True)
            assert _core.quant.avx2_vnni()
        else:
            with pytest.raises(ValueError, match="no AVX-VNNI"):
                _core.quant.set_avx2_vnni(True)
    finally:
        _core.quant.set_avx2_vnni(has)
