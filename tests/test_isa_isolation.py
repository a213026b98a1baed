"""The built core runs on every x86-64 CPU: no code built for one ISA path leaks to the others.

Each ISA path is its own translation units, built with its own flags (CMakeLists.txt). An
inline function or template they share with the rest (std::vector<float>'s members, say) is
emitted by every unit that uses it, each copy built with that unit's flags, and the linker keeps
one copy, a weak symbol, for every caller. Were it an AVX-512 unit's, the baseline code calling it
would die of an illegal instruction on an AVX2-only CPU, as the core once did on the first AVX2-only
machine it met (std::vector<float>::_M_fill_assign, built with zmm broadcasts, called by the
scheduler). A static check of the built module, so any machine's test run catches it, whatever its
own CPU: no weak symbol holds a VEX or EVEX instruction.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ctxengine import _core

pytestmark = pytest.mark.skipif(
    shutil.which("nm") is None or shutil.which("objdump") is None, reason="binutils (nm, objdump) is not installed"
)

INSTRUCTION = re.compile(r"^\s*(?P<address>[0-9a-f]+):\t(?P<op>\S+)")
# VEX/EVEX encodings: every such mnemonic starts with "v"; ymm, zmm and mask registers besides.
WIDE = re.compile(r"%[yz]mm\d|%k[0-7]\b")


def functions_of(path: str) -> list[tuple[int, int, str, str]]:
    """(address, size, nm type, name) of the module's functions: its dynamic symbols (a wheel's
    module is stripped of the rest, and the shared copies of std:: templates are exported), and
    where the module is not stripped (a dev build), every other symbol too (hidden inline
    functions of our own headers)."""
    found = set()
    for table in (["-D"], []):
        out = subprocess.run(["nm", *table, "-S", "--defined-only", path], capture_output=True, text=True).stdout
        for parts in (line.split() for line in out.splitlines()):
            if len(parts) == 4:
                found.add((int(parts[0], 16), int(parts[1], 16), parts[2], parts[3]))
    return sorted(found)


def vector_code(path: str, functions: list[tuple[int, int, str, str]]) -> dict[str, list[str]]:
    """The VEX/EVEX instructions of each of these functions that has any."""
    spans = sorted((address, address + size, name) for address, size, _, name in functions if size)
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[str]] = {}
    i = 0
    for line in out.splitlines():
        insn = INSTRUCTION.match(line)
        if not insn:
            continue
        address = int(insn.group("address"), 16)
        while i < len(spans) and spans[i][1] <= address:
            i += 1
        if i == len(spans):
            break
        start, _, name = spans[i]
        if address >= start and (insn.group("op").startswith("v") or WIDE.search(line)):
            found.setdefault(name, []).append(insn.group("op"))
    return found


def test_no_shared_copy_holds_code_of_one_isa_path():
    path = _core.__file__
    weak = [f for f in functions_of(path) if f[2] in "WVu"]
    assert weak, "nm listed no weak symbols: the check would prove nothing"
    leaks = vector_code(path, weak)
    assert not leaks, "shared (weak) functions built for an ISA path, which baseline code may call: " + "; ".join(
        f"{name}: {ops[:3]}" for name, ops in sorted(leaks.items())
    )


def test_the_check_sees_vector_code_where_there_is_some():
    """The scan itself works: the module's one entry point (PyInit__core) is baseline code,
    and every exported function it scans is found in the disassembly."""
    path = _core.__file__
    functions = functions_of(path)
    assert any(name == "PyInit__core" for *_, name in functions)
    assert "PyInit__core" not in vector_code(path, functions)
