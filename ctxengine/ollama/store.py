"""Models in Ollama's store, found in place and read, never written.

A store (``$OLLAMA_MODELS``, else ``~/.ollama/models`` or
``/usr/share/ollama/.ollama/models``) holds ``manifests/<host>/<namespace>/
<model>/<tag>`` (JSON: a config blob and layers) and ``blobs/sha256-<hex>``.
Names are parsed and shown as ollama/ollama's ``types/model/name.go`` does:
``smollm2`` is ``registry.ollama.ai/library/smollm2:latest`` and is shown as
``smollm2:latest``; other namespaces and hosts stay in the shown name.

Each manifest becomes one CatalogEntry whose path is the model blob (a GGUF
file).  The params, system, template and license layers are read into it.
A manifest we cannot serve (malformed JSON, a missing or short blob,
safetensors tensors, an adapter or projector, a GGUF whose architecture or
tensor types we do not run, a cloud model) is still listed, with the reason
in ``error``; one bad manifest never hides the others.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .. import paths
from ..errors import CtxError, InvalidNameError
from ..engine.catalog import ModelCatalog
from ..engine.servable import adapter_reason, unservable_reason
from ..engine.model_source import CatalogEntry
from .options import params_problem

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})\Z")

MODEL = "application/vnd.ollama.image.model"
ADAPTER = "application/vnd.ollama.image.adapter"  # a Modelfile's ADAPTER: a LoRA GGUF, served in place
# Layers that carry weights we cannot use, and why.
REFUSED_LAYERS = {
    "application/vnd.ollama.image.tensor": "safetensors tensor layers are not supported (GGUF only)",
    "application/vnd.ollama.image.projector": "vision projector layers are not supported",
}
TEXT_LAYERS = {"application/vnd.ollama.image.template": "template", "application/vnd.ollama.image.prompt": "template",
               "application/vnd.ollama.image.system": "system", "application/vnd.ollama.image.license": "license"}
PARAMS = "application/vnd.ollama.image.params"


def _valid_part(kind: str, s: str) -> bool:
    """types/model/name.go isValidPart."""
    limit = 350 if kind == "host" else 80
    if not 1 <= len(s) <= limit or not (s[0].isascii() and (s[0].isalnum() or s[0] == "_")):
        return False
    extra = {"host": "-_.:", "namespace": "-_", "model": "-_.", "tag": "-_."}[kind]
    return all((c.isascii() and c.isalnum()) or c in extra for c in s[1:])


@dataclass(frozen=True, eq=False)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    @property
    def display(self) -> str:
        """Name.DisplayShortest: the default host and namespace left out."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    @property
    def full(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    def spellings(self) -> tuple[str, ...]:
        """Every way a client may write this name that parses back to it."""
        out = [self.full, f"{self.namespace}/{self.model}:{self.tag}", self.display]
        if self.host.lower() == DEFAULT_HOST and self.namespace.lower() == DEFAULT_NAMESPACE:
            out.append(f"{self.model}:{self.tag}")
        if self.tag.lower() == DEFAULT_TAG:
            out += [s[: -len(":" + self.tag)] for s in out]
        return tuple(dict.fromkeys(s for s in out if parse_model_name(s) == self))

    def key(self) -> tuple[str, ...]:
        return (self.host.lower(), self.namespace.lower(), self.model.lower(), self.tag.lower())

    def __eq__(self, other: object) -> bool:  # names compare case-insensitively (Name.EqualFold)
        return isinstance(other, OllamaName) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


def parse_model_name(name: str) -> OllamaName:
    """types/model/name.go ParseName: [scheme://][host/][namespace/]model[:tag], defaults filled."""
    s = name.strip()
    tag = DEFAULT_TAG
    if s.rfind(":") > s.rfind("/"):
        s, tag = s.rsplit(":", 1)
    parts = s.split("/")
    if len(parts) > 3:
        parts = ["/".join(parts[:-2]), *parts[-2:]]  # the host keeps the rest, as Go's cut does
    model = parts[-1]
    namespace = parts[-2] if len(parts) > 1 else DEFAULT_NAMESPACE
    host = parts[-3].split("://", 1)[-1] if len(parts) > 2 else DEFAULT_HOST
    parsed = OllamaName(host, namespace, model, tag)
    for kind, part in zip(("host", "namespace", "model", "tag"), (host, namespace, model, tag)):
        if not _valid_part(kind, part):
            raise InvalidNameError(f"'{name}' is not a valid Ollama model name (bad {kind} '{part}')")
    return parsed


def ollama_roots() -> list[Path]:
    """The stores that exist: $OLLAMA_MODELS if set, else the user's and the service's;
    then our own, where ``ctx pull ollama://...`` writes (registry_pull.py)."""
    env = os.environ.get("OLLAMA_MODELS")
    candidates = [Path(env).expanduser()] if env else [
        Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    candidates.append(paths.data_dir() / "ollama")
    out: list[Path] = []
    for p in candidates:
        if (p / "manifests").is_dir() and p.resolve() not in [q.resolve() for q in out]:
            out.append(p)
    return out


def manifests(root: Path) -> Iterable[tuple[OllamaName | None, Path]]:
    """(name or None when the path is not a valid name, manifest file) under a store."""
    base = root / "manifests"
    for path in sorted(base.glob("*/*/*/*")):
        if not path.is_file():
            continue
        host, namespace, model, tag = path.relative_to(base).parts
        name = OllamaName(host, namespace, model, tag)
        valid = all(_valid_part(k, p) for k, p in zip(("host", "namespace", "model", "tag"), name.key()))
        yield (name if valid else None), path


def add_ollama_models(catalog: ModelCatalog, roots: Iterable[str | os.PathLike]) -> list[CatalogEntry]:
    """One entry per manifest in each store (names already taken keep their first entry)."""
    added = []
    for root in roots:
        for name, path in manifests(Path(root)):
            if name is None:  # no model's name (a .DS_Store, "-bad"): skipped, as Ollama's listing skips it
                continue
            added.append(catalog.add(read_manifest(Path(root), name, path)))
    return added


def find_ollama_model(spec: str, roots: Iterable[str | os.PathLike] | None = None) -> CatalogEntry | None:
    """The entry for an Ollama name in the stores (any spelling, any case), or None."""
    try:
        wanted = parse_model_name(spec)
    except InvalidNameError:
        return None
    for root in ollama_roots() if roots is None else roots:
        for name, path in manifests(Path(root)):
            if name == wanted:
                return read_manifest(Path(root), name, path)
    return None


class OllamaSource:
    """Ollama's stores as a model source for the registry and the catalog (engine/model_source.py)."""

    def find(self, spec: str) -> CatalogEntry | None:
        return find_ollama_model(spec)

    def canonical_name(self, name: str) -> str | None:
        try:
            return parse_model_name(name).full
        except InvalidNameError:
            return None


# -- one manifest -----------------------------------------------------------------------
class _Refused(Exception):
    """Why this manifest cannot be served."""


def read_manifest(root: Path, name: OllamaName, path: Path) -> CatalogEntry:
    entry = CatalogEntry(name.display, None, "ollama", aliases=name.spellings(), modified=_mtime(path))
    try:
        raw = path.read_bytes()
        entry.digest = hashlib.sha256(raw).hexdigest()
        manifest = _json(raw, "the manifest")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
            raise _Refused("the manifest has no layer list")
        entry.manifest_size = _manifest_size(manifest)
        entry.config = _read_config(root, manifest.get("config"))
        if entry.config.get("remote_host"):
            raise _Refused(f"a cloud model served by {entry.config['remote_host']}, not stored here")
        model_path = _read_layers(root, manifest["layers"], entry)
        _check_gguf(model_path)
        for adapter in entry.adapters:
            if (why := adapter_reason(adapter, model_path)) is not None:
                raise _Refused(f"its ADAPTER layer cannot be used: {why}")
        entry.path = model_path
    except _Refused as why:
        entry.error = str(why)
    except (OSError, UnicodeDecodeError) as err:
        entry.error = f"cannot read the manifest or a blob: {err}"
    except CtxError as err:
        entry.error = str(err)
    return entry


def _manifest_size(manifest: dict) -> int:
    """Manifest.Size: the sizes the manifest states for its layers and its config."""
    items = [*manifest["layers"], manifest.get("config")]
    return sum(i["size"] for i in items if isinstance(i, dict) and type(i.get("size")) is int and i["size"] > 0)


def _blob(root: Path, layer: object) -> tuple[Path, dict]:
    if not isinstance(layer, dict) or not isinstance(layer.get("digest"), str):
        raise _Refused("a layer has no digest")
    m = DIGEST.match(layer["digest"])
    if m is None:
        raise _Refused(f"layer digest {layer['digest']!r} is not a sha256 digest")
    path = root / "blobs" / f"sha256-{m.group(1)}"
    if not path.is_file():
        raise _Refused(f"blob {path.name} is missing from {root / 'blobs'}")
    size = layer.get("size")
    if isinstance(size, int) and path.stat().st_size != size:
        raise _Refused(f"blob {path.name} has {path.stat().st_size} bytes, the manifest says {size}")
    return path, layer


def _read_config(root: Path, layer: object) -> dict:
    if not layer:
        return {}
    path, _ = _blob(root, layer)
    config = _json(path.read_bytes(), "the config blob")
    if not isinstance(config, dict):
        raise _Refused("the config blob is not a JSON object")
    fmt = config.get("model_format")
    if fmt and fmt != "gguf":
        raise _Refused(f"model format '{fmt}' is not supported (GGUF only)")
    return config


def _read_layers(root: Path, layers: list, entry: CatalogEntry) -> Path:
    model_path = None
    for layer in layers:
        media = layer.get("mediaType") if isinstance(layer, dict) else None
        if media in REFUSED_LAYERS:
            raise _Refused(REFUSED_LAYERS[media])
        if media == MODEL:
            if model_path is not None:
                raise _Refused("more than one model layer")
            model_path, _ = _blob(root, layer)
            entry.parent_model = layer.get("from") or ""
        elif media == ADAPTER:
            entry.adapters += (_blob(root, layer)[0],)
        elif media in TEXT_LAYERS:
            setattr(entry, TEXT_LAYERS[media], _blob(root, layer)[0].read_text("utf-8"))
        elif media == PARAMS:
            params = _json(_blob(root, layer)[0].read_bytes(), "the params layer")
            if not isinstance(params, dict):
                raise _Refused("the params layer is not a JSON object")
            if (why := params_problem(params)) is not None:
                raise _Refused(why)
            entry.params = params
    if model_path is None:
        raise _Refused("no GGUF model layer")
    return model_path


def _check_gguf(path: Path) -> None:
    """What the engine would refuse, read from the header only (no weights loaded)."""
    why = unservable_reason(path)
    if why is not None:
        raise _Refused(why)


def _json(raw: bytes, what: str):
    try:
        return json.loads(raw)
    except ValueError as err:
        raise _Refused(f"{what} is not valid JSON: {err}") from None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
