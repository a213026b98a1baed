"""Lay out an Ollama model store on disk, as `ollama create` leaves it.

Followed from the ollama/ollama sources (manifest/manifest.go WriteManifest,
manifest/layer.go NewLayer, manifest/paths.go BlobsPath, server/create.go
createConfigLayer and setTemplate/setSystem/setParameters, types/model/name.go,
types/model/config.go ConfigV2, format/format.go HumanNumber):

    <root>/manifests/<host>/<namespace>/<model>/<tag>   the manifest (JSON)
    <root>/blobs/sha256-<hex>                           every layer and the config

Go's ``json.Encoder`` writes compact JSON, escapes ``<``, ``>`` and ``&`` as
``\\u003c``/``\\u003e``/``\\u0026`` and ends with a newline; map keys (the
params layer) come out sorted.  We write the same bytes, so digests match what
Ollama would compute.  The model blob is the GGUF file itself: hard-linked when
it shares a filesystem with the store, else symlinked, else copied.

This module is independent of ``ctxengine.ollama.store`` on purpose: the
reader is tested against a writer that did not share its code.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import gguf

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
MODEL_TYPE = "application/vnd.ollama.image.model"
PARAMS_TYPE = "application/vnd.ollama.image.params"
SYSTEM_TYPE = "application/vnd.ollama.image.system"
TEMPLATE_TYPE = "application/vnd.ollama.image.template"


def go_json(value: Any) -> bytes:
    """What Go's json.NewEncoder(w).Encode(value) writes."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return (text + "\n").encode()


def split_name(name: str, host: str = DEFAULT_HOST) -> tuple[str, str, str, str]:
    """(host, namespace, model, tag) as types/model/name.go ParseName fills defaults."""
    rest, tag = name, DEFAULT_TAG
    if rest.rfind(":") > rest.rfind("/"):
        rest, tag = rest.rsplit(":", 1)
    parts = rest.split("/")
    if len(parts) > 3:
        raise ValueError(f"bad Ollama model name {name!r}")
    model = parts[-1]
    namespace = parts[-2] if len(parts) >= 2 else DEFAULT_NAMESPACE
    host = parts[-3] if len(parts) == 3 else host
    return host, namespace, model, tag


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    """types/model/name.go DisplayShortest."""
    if host.lower() != DEFAULT_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    if namespace.lower() != DEFAULT_NAMESPACE:
        return f"{namespace}/{model}:{tag}"
    return f"{model}:{tag}"


def human_number(n: int) -> str:
    """format/format.go HumanNumber (Ollama's parameter_size text)."""
    for unit, scale, decimals in (("B", 10**9, 1), ("M", 10**6, 2)):
        if n >= scale:
            x = n / scale
            return f"{x:.0f}{unit}" if x == int(x) else f"{x:.{decimals}f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


@functools.lru_cache(maxsize=None)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    st = os.stat(path)
    return _file_sha256(os.fspath(path), st.st_size, st.st_mtime_ns)


def _blob_path(root: Path, hexdigest: str) -> Path:
    return root / "blobs" / f"sha256-{hexdigest}"


def _write_blob(root: Path, data: bytes, media_type: str) -> dict:
    hexdigest = hashlib.sha256(data).hexdigest()
    path = _blob_path(root, hexdigest)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": len(data)}


def _link_model_blob(root: Path, gguf_path: Path) -> dict:
    hexdigest = file_sha256(gguf_path)
    path = _blob_path(root, hexdigest)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        try:
            os.link(gguf_path, path)
        except OSError:
            try:
                os.symlink(gguf_path.resolve(), path)
            except OSError:
                shutil.copyfile(gguf_path, path)
    return {"mediaType": MODEL_TYPE, "digest": f"sha256:{hexdigest}", "size": gguf_path.stat().st_size}


def _file_type_name(value: int | None) -> str:
    """The llama_ftype name Ollama shows as quantization_level (fs/ggml/type.go)."""
    if value is None:
        return "unknown"
    try:
        name = gguf.LlamaFileType(int(value)).name
    except ValueError:
        return "unknown"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _config_for(gguf_path: Path) -> dict:
    """ConfigV2 as server/create.go fills it from the model layer (blank for a
    file that is not a valid GGUF: tests lay out broken stores on purpose)."""
    from ctxengine.engine.gguf_file import open_gguf
    from ctxengine.errors import CtxError

    try:
        with open_gguf(gguf_path) as f:
            arch = f.arch
            n_params = sum(_product(t.shape) for t in f.tensors.values())
            file_type = _file_type_name(f.get("general.file_type"))
    except CtxError:
        arch, n_params, file_type = "", 0, "unknown"
    return {"model_format": "gguf", "model_family": arch, "model_families": [arch] if arch else None,
            "model_type": human_number(n_params) if n_params else "", "file_type": file_type,
            "architecture": "amd64", "os": "linux"}


def _product(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def make_ollama_store(root: str | os.PathLike, name: str, gguf_path: str | os.PathLike, *,
                      params: dict | None = None, system: str | None = None, template: str | None = None,
                      host: str = DEFAULT_HOST, extra_layers: Sequence[tuple[str, bytes]] = (),
                      config: dict | None = None) -> str:
    """Add model `name` (e.g. "smollm2:135m") with `gguf_path` as its model layer
    to the store at `root`; returns the name as Ollama displays it.

    `extra_layers` are (mediaType, bytes) appended after the others (e.g. a
    safetensors tensor layer or an adapter); `config` replaces the config blob.
    """
    root = Path(root)
    h, namespace, model, tag = split_name(name, host)
    gguf_path = Path(gguf_path)
    layers = [_link_model_blob(root, gguf_path)]
    if template is not None:
        layers.append(_write_blob(root, template.encode(), TEMPLATE_TYPE))
    if system:
        layers.append(_write_blob(root, system.encode(), SYSTEM_TYPE))
    if params:
        layers.append(_write_blob(root, go_json(dict(sorted(params.items()))), PARAMS_TYPE))
    for media_type, data in extra_layers:
        layers.append(_write_blob(root, data, media_type))
    config_layer = _write_blob(root, go_json(config if config is not None else _config_for(gguf_path)), CONFIG_TYPE)
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config_layer, "layers": layers}
    path = root / "manifests" / h / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(go_json(manifest))
    return display_name(h, namespace, model, tag)


def manifest_path(root: str | os.PathLike, name: str, host: str = DEFAULT_HOST) -> Path:
    """Where the manifest for `name` lives under `root`."""
    return Path(root, "manifests", *split_name(name, host))


def blob_path(root: str | os.PathLike, digest: str) -> Path:
    """The blob for a layer digest ("sha256:<hex>")."""
    return Path(root, "blobs", digest.replace(":", "-"))
