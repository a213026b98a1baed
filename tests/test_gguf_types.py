"""gguf_types.py's tables, written out so that reading a header imports no ``gguf``
(nor numpy), equal to the gguf package's, which stays the reference."""
import subprocess
import sys

import gguf

from ctxengine.engine.gguf_types import TENSOR_TYPES, ValueType, tensor_type


def test_the_value_types_are_the_packages():
    assert {t.name: int(t) for t in ValueType} == {t.name: int(t) for t in gguf.GGUFValueType}


def test_every_tensor_type_of_the_package_has_its_name_and_block_sizes():
    for t, (block, block_bytes) in gguf.GGML_QUANT_SIZES.items():
        assert tensor_type(int(t)) == (t.name, block, block_bytes), t.name
    ours_only = set(TENSOR_TYPES) - {int(t) for t in gguf.GGML_QUANT_SIZES}
    assert not ours_only, f"types the package does not know: {ours_only}"


def test_an_id_nobody_knows_is_none():
    for type_id in (4, 5, 31, 36, 255, -1, 1 << 40):
        assert tensor_type(type_id) is None


def test_a_type_only_the_package_knows_is_found_there(monkeypatch):
    # A newer gguf than this table: its type is read from the package, not refused.
    monkeypatch.delitem(TENSOR_TYPES, 8)
    assert tensor_type(8) == ("Q8_0", 32, 34)


def test_reading_a_header_imports_neither_gguf_nor_numpy(smollm2_path, gemma3_path):
    # The servability check of every pull and catalog scan: 50-70 ms of gguf's import and
    # 70-100 ms of numpy's (docs/PERFORMANCE.md, session 33). The native core too loads without numpy.
    code = ("import sys, pathlib; from ctxengine.engine.servable import unservable_reason; "
            f"assert unservable_reason(pathlib.Path({str(smollm2_path)!r})) is None; "
            f"assert unservable_reason(pathlib.Path({str(gemma3_path)!r})) is None; "
            "import ctxengine._core; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'gguf', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
