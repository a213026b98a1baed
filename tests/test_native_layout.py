"""The native core's layout, checked (docs/architecture.md, native/): the
forward pass depends on the kernels one way, every kernel lives under
native/kernels/, and an ISA's flags stay in its own translation units.

Read from the sources with a regex over ``#include`` lines: no build needed.
"""
from __future__ import annotations

import re
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent / "native"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
ISA_FILE = re.compile(r"_(avx2|avx512)\.cpp$")


def includes(path: Path) -> list[str]:
    return INCLUDE.findall(path.read_text())


def sources() -> list[Path]:
    return sorted(p for p in NATIVE.rglob("*") if p.suffix in (".h", ".cpp"))


def test_kernels_never_include_models():
    wrong = [
        f"{p.relative_to(NATIVE)} includes {inc}"
        for p in sources()
        if p.relative_to(NATIVE).parts[0] == "kernels"
        for inc in includes(p)
        if inc.startswith("models/")
    ]
    assert not wrong, "kernels/ must not depend on models/:\n" + "\n".join(wrong)


def test_every_isa_translation_unit_is_a_kernel():
    # Only kernels are built per ISA; the forward pass runs on baseline x86-64
    # and reaches them through the kernel table.
    outside = [str(p.relative_to(NATIVE)) for p in sources() if ISA_FILE.search(p.name)
               and p.relative_to(NATIVE).parts[0] != "kernels"]
    assert not outside, "per-ISA files outside native/kernels/: " + ", ".join(outside)


def test_simd_bodies_are_included_only_by_their_isa_files():
    # A *_simd.h body holds intrinsics for the including unit's flags; from a
    # baseline file it would not compile, or would merge code across flags.
    wrong = [
        f"{p.relative_to(NATIVE)} includes {inc}"
        for p in sources()
        if p.suffix == ".cpp" and not ISA_FILE.search(p.name)
        for inc in includes(p)
        if inc.endswith("_simd.h") or inc == "kernels/simd_f32.h"
    ]
    assert not wrong, "\n".join(wrong)


def test_every_include_names_a_file_of_the_tree():
    missing = [
        f"{p.relative_to(NATIVE)} includes {inc}"
        for p in sources()
        for inc in includes(p)
        if not (NATIVE / inc).is_file()
    ]
    assert not missing, "\n".join(missing)
