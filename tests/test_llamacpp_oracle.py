"""The live oracle's own failure paths (tests/llamacpp.py): a llama.cpp that
dies is named in one line, an AMX guest fault with its cure; none is needed."""
import os
import stat

import pytest

from llamacpp import LlamaCpp, crash_reason


def test_a_child_killed_by_a_signal_is_named_in_one_line(tmp_path, smollm2_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ggml_compute_forward: about to fault' >&2\nkill -SEGV $$\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(RuntimeError) as err:
        LlamaCpp(str(fake)).run(smollm2_path, [{"kind": "info"}])
    message = str(err.value)
    assert "signal SIGSEGV" in message and "about to fault" in message and "\n" not in message


def test_a_fault_on_a_cpu_that_lists_amx_names_the_cause_and_the_build_flags():
    line = crash_reason(-11, "", flags={"avx512f", "amx_tile", "amx_int8"})
    assert "amx_tile, amx_int8" in line and "GGML_NATIVE=OFF" in line and "GGML_AMX_TILE=OFF" in line
    assert "AMX" not in crash_reason(-11, "", flags={"avx512f"})
    assert "exit status 1" in crash_reason(1, "Traceback\nValueError: bad\n", flags=set())


def test_without_llama_cpp_the_live_tests_skip_unless_required(monkeypatch):
    from llamacpp import open_llamacpp

    monkeypatch.setenv("CTX_LLAMACPP_PYTHON", os.devnull)  # not an interpreter at all
    monkeypatch.delenv("CTX_REQUIRE_LLAMACPP", raising=False)
    with pytest.raises(pytest.skip.Exception, match="cannot import llama_cpp"):
        open_llamacpp()
    monkeypatch.setenv("CTX_REQUIRE_LLAMACPP", "1")
    with pytest.raises(pytest.fail.Exception, match="CTX_REQUIRE_LLAMACPP=1 but"):
        open_llamacpp()
