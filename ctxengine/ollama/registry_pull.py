"""``ctx pull ollama://[HOST/]NAMESPACE/NAME:TAG``: a model from an Ollama
registry, written into an Ollama-layout store as ``ollama pull`` writes it.

The registry speaks the Docker distribution protocol, as Ollama's
server/images.go PullModel uses it:

    GET /v2/<namespace>/<model>/manifests/<tag>
        Accept: application/vnd.docker.distribution.manifest.v2+json
    GET /v2/<namespace>/<model>/blobs/sha256:<hex>     (redirects followed, Range honoured)

Every blob (the config and each layer: model, template, params, system,
license, adapter...) lands in ``blobs/sha256-<hex>`` once its sha256 matches
(blob_download.py: resumable, verified); the manifest, exactly the bytes the
registry sent, is written last into ``manifests/<host>/<namespace>/<model>/<tag>``,
so a store never names a blob it lacks. The store is our own
(``$CTX_HOME``/XDG data dir ``ollama/``) unless asked for another, such as
``$OLLAMA_MODELS``: then Ollama itself serves the model too.

Names default as Ollama's do (``gemma3`` is ``registry.ollama.ai/library/
gemma3:latest``). The default registry is reached over https, a registry on
a loopback address over http; ``CTX_OLLAMA_REGISTRY`` (a URL) stands in for
the default registry, as ``HF_ENDPOINT`` does for the Hub.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import paths
from ..engine.model_source import CatalogEntry
from ..errors import CtxError, ModelNotFoundError, UnavailableError
from ..engine.disk import check_free_space, storage_error
from ..engine.http_fetch import TIMEOUT, http_reason
from .blob_download import fetch_blob, partial_path
from .store import DEFAULT_HOST, OllamaName, manifests, parse_model_name, read_manifest

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
REGISTRY_ENV = "CTX_OLLAMA_REGISTRY"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")  # as a registry writes one (fullmatch: no case, no newline)
MANIFEST_LIMIT = 4 << 20  # bytes: a model's manifest is about 1 KB


def own_store() -> Path:
    """Where ``ctx pull ollama://...`` writes unless told otherwise."""
    return paths.data_dir() / "ollama"


@dataclass
class PulledModel:
    entry: CatalogEntry     # the model as the store now lists it (servable, or why not)
    manifest: Path
    total: int              # bytes of all its blobs
    received: int           # bytes this pull took from the network
    resumed: int            # bytes an earlier, interrupted pull had already fetched
    seconds: float = 0.0    # spent moving and checking the bytes (not naming or validating the model)


def registry_base(name: OllamaName) -> str:
    """The registry's URL for a name's host."""
    override = os.environ.get(REGISTRY_ENV)
    if override and name.host.lower() == DEFAULT_HOST:
        return override.rstrip("/")
    hostname = urllib.parse.urlsplit(f"//{name.host}").hostname or ""
    scheme = "http" if hostname in LOOPBACK else "https"
    return f"{scheme}://{name.host}"


def pull_ollama(spec: str, *, store: str | os.PathLike | None = None, progress=None,
                stage: Callable[[str, str | None, int | None], None] | None = None) -> PulledModel:
    """Pull ``[HOST/]NAMESPACE/NAME:TAG`` into store (default: own_store()).
    ``progress(total)`` makes a context manager whose ``update(n)`` is told each n bytes.
    ``stage(status, digest, size)`` is told each step as Ollama's server names it:
    "pulling manifest"; "pulling <12 hex>" before each blob (with its digest and size);
    "verifying sha256 digest" once every blob is in (each was checked as it landed);
    "writing manifest"."""
    stage = stage or (lambda status, digest, size: None)
    name = parse_model_name(spec)
    root = Path(store).expanduser() if store is not None else own_store()
    base = registry_base(name)
    stage("pulling manifest", None, None)
    raw = _manifest(base, name, root)
    blobs = _blobs_of(raw, name)
    total = sum(size for _, size in blobs)
    blob_dir = root / "blobs"
    needed = sum(size - _size_of(partial_path(blob_dir / f"sha256-{hex_}"))
                 for hex_, size in blobs if not (blob_dir / f"sha256-{hex_}").is_file())
    try:
        blob_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(err, blob_dir) from None
    check_free_space(blob_dir, needed)
    received = resumed = 0
    started = time.perf_counter()
    with _bar(progress, total, name) as bar:
        for hex_, size in blobs:
            stage(f"pulling {hex_[:12]}", f"sha256:{hex_}", size)
            url = f"{base}/v2/{name.namespace}/{name.model}/blobs/sha256:{hex_}"
            got = fetch_blob(url, blob_dir / f"sha256-{hex_}", hex_, size, headers={},
                             progress=bar.update, describe=lambda err: _http_error(err, name, base, "blob"),
                             what=f"{name.display}'s layer sha256:{hex_[:12]}")
            received += got.received
            resumed += got.resumed_from
    seconds = time.perf_counter() - started
    stage("verifying sha256 digest", None, None)
    for hex_, size in blobs:  # each was checked as it landed; still there, whole (a delete may race a pull)
        if _size_of(blob_dir / f"sha256-{hex_}") != size:
            raise CtxError(f"blob sha256:{hex_} of {name.display} left {blob_dir} while it was pulled "
                           f"(a model sharing it was deleted?): run the pull again")
    stage("writing manifest", None, None)
    manifest = _write_manifest(root, name, raw)
    return PulledModel(read_manifest(root, name, manifest), manifest, total, received, resumed, seconds)


def _manifest(base: str, name: OllamaName, root: Path) -> bytes:
    url = f"{base}/v2/{name.namespace}/{name.model}/manifests/{name.tag}"
    request = urllib.request.Request(url, headers={"Accept": MANIFEST_TYPE})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            raw = response.read(MANIFEST_LIMIT + 1)
            if response.length and len(raw) <= MANIFEST_LIMIT:  # closed short of its Content-Length
                raise http.client.IncompleteRead(raw, response.length)
    except urllib.error.HTTPError as err:
        raise _http_error(err, name, base, "manifest") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, UnicodeError) as err:
        # Unavailable (a server's 503), not "not found": the name may well be right.
        raise UnavailableError(f"cannot reach the registry {base} ({getattr(err, 'reason', err)}): "
                               f"{name.display} was not pulled; {_stored(root, name)}") from None
    except http.client.HTTPException as err:
        raise CtxError(f"the registry {base}'s answer for the manifest of {name.display} broke off "
                       f"({err.__class__.__name__}): run the pull again") from None
    if len(raw) > MANIFEST_LIMIT:
        raise CtxError(f"the registry {base} sent more than {MANIFEST_LIMIT >> 20} MiB for the manifest of "
                       f"{name.display}; a manifest is a few KB: refusing it")
    return raw


def _stored(root: Path, wanted: OllamaName) -> str:
    """What a store holds already, for an error that cannot reach the registry."""
    names = [n.display for n, _ in manifests(root) if n is not None] if (root / "manifests").is_dir() else []
    if any(parse_model_name(n) == wanted for n in names):
        return f"it is already in {root} and loads without the network"
    return f"{root} holds {', '.join(names)}" if names else f"{root} holds no models yet"


def _blobs_of(raw: bytes, name: OllamaName) -> list[tuple[str, int]]:
    """(sha256 hex, size) of the config and every layer, in manifest order."""
    try:
        manifest = json.loads(raw)
        layers = [manifest["config"], *manifest["layers"]] if manifest.get("config") else list(manifest["layers"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # RecursionError: [[[[...]]]]
        raise CtxError(f"the registry's manifest for {name.display} is not an image manifest") from None
    out: dict[str, int] = {}
    for layer in layers:
        digest = layer.get("digest") if isinstance(layer, dict) else None
        m = DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        size = layer.get("size") if isinstance(layer, dict) else None
        if m is None or type(size) is not int or size < 0:
            raise CtxError(f"the registry's manifest for {name.display} has a layer without a "
                           f"sha256 digest (sha256:<64 lowercase hex>) and size: {layer!r}"[:300])
        if out.setdefault(m.group(1), size) != size:  # a blob has one size: the manifest is wrong about one
            raise CtxError(f"the registry's manifest for {name.display} names sha256:{m.group(1)} twice, as "
                           f"{out[m.group(1)]} and {size} bytes: refusing it")
    return list(out.items())


def _http_error(err: urllib.error.HTTPError, name: OllamaName, base: str, what: str) -> CtxError:
    if err.code in (401, 403):
        return CtxError(f"{base} wants a token for {name.display} (HTTP {err.code}): the model is private, "
                        "or the name is wrong (a registry answers 401 for names it does not show)")
    if err.code == 404:
        missing = "no such model or tag" if what == "manifest" else "a blob its manifest names is missing there"
        return ModelNotFoundError(f"{name.display} not found on {base} ({missing}): check the name and "
                                  "the tag (ollama://NAMESPACE/NAME:TAG, e.g. ollama://library/gemma3:270m)")
    return CtxError(f"{base} answered HTTP {err.code} {http_reason(err)} for the {what} of {name.display}")


def _write_manifest(root: Path, name: OllamaName, raw: bytes) -> Path:
    """The manifest written in place of the name's (in the spelling the store has it in,
    as Ollama's getExistingName: names are one whatever their case)."""
    target = next((path for n, path in manifests(root) if n == name),
                  root / "manifests" / name.host / name.namespace / name.model / name.tag)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{name.tag}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.replace(tmp, target)
    except OSError as err:
        raise storage_error(err, target.parent) from None
    return target


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _bar(progress, total: int, name: OllamaName):
    if progress is not None:
        return progress(total)
    from tqdm import tqdm

    # Bytes, rate and time left, on a terminal (disable=None: not into logs, as ctx's other bars).
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"pull {name.display}",
                dynamic_ncols=True, mininterval=0.25, disable=None)
