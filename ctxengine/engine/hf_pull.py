"""``ctx pull hf://ORG/REPO[:QUANT]``: a GGUF model from the Hugging Face Hub,
through ``huggingface_hub``, into its cache (shared with every tool that uses
it; ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME``/``HF_HUB_CACHE`` and
``HF_HUB_OFFLINE`` mean what they mean there).

Which file: hf_files.py. How it arrives: the repo's listing (hf_listing.py,
model_info's request) pins its commit, so every part of a split model comes
from one commit; the bytes of each file, from the URL huggingface_hub
resolves, go (hf_transfer.py) into ``blobs/<etag>.incomplete`` (the name
huggingface_hub itself long resumed from), so a pull killed or interrupted
resumes with a range request instead of starting over, which
huggingface_hub's own download no longer does. A finished blob is checked
against its sha256 (the etag of every LFS file) and only then renamed into
place; ``hf_hub_download`` then links it into the cache's snapshot as it
would its own download. A cached file of another size than the Hub declares
(one truncated) is fetched again, the blob replaced only by bytes that check
out; answers of the Hub's that are not what a Hub answers are refused as
such (hf_transfer.not_understood), before they name a file.

Loading never touches the network: a pulled name resolves from the cache
(``cached_model``), and pulled models are remembered in
``<data dir>/hf-models.json`` so ``ctx models list`` and ``ctx serve`` list them.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import paths
from ..errors import CtxError, ModelNotFoundError
from .disk import check_free_space, storage_error
from .hf_files import Choice, HfSpec, choose, incomplete_splits, parse_hf_spec
from .hf_listing import Listing, repo_listing
from .hf_transfer import check_resolved, download, verify
from .http_fetch import claimed, install

INDEX = "hf-models.json"


@dataclass
class HubSettings:
    endpoint: str
    cache_dir: str
    offline: bool


def hub_settings() -> HubSettings:
    """Read at call time: huggingface_hub reads its environment once, at import."""
    from huggingface_hub import constants

    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE)
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    return HubSettings(os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/"),
                       os.path.expanduser(cache), offline or constants.is_offline_mode())


@dataclass
class PulledHf:
    spec: HfSpec
    commit: str
    files: tuple[str, ...]   # paths in the repo; a split model's parts in order
    path: Path               # the (first) file in the cache's snapshot
    total: int = 0           # bytes of the files
    received: int = 0        # bytes this pull took from the network
    resumed: int = 0         # bytes an interrupted pull had already fetched
    seconds: float = 0.0     # spent moving and checking the bytes
    unrecorded: str | None = None  # why it could not be listed under its name (data folder not writable)


def pull_hf(text: str) -> PulledHf:
    """Pull the model a spec names (nothing moves when the cache has it)."""
    spec = parse_hf_spec(text)
    hub = hub_settings()
    if hub.offline:
        return _from_cache(spec, hub, "HF_HUB_OFFLINE is set")
    try:
        listing = repo_listing(spec.repo, hub.endpoint)
        choice = choose(spec, list(listing.sizes))
        Path(hub.cache_dir).mkdir(parents=True, exist_ok=True)
        check_free_space(Path(hub.cache_dir), _still_needed(spec.repo, choice.files, listing, hub))
        pulled = PulledHf(spec, listing.commit, choice.files, Path())
        started = time.perf_counter()
        for i, name in enumerate(choice.files):
            path, received, resumed = _download_named(spec.repo, name, listing.commit, hub, listing.lfs.get(name),
                                                      listing.sizes.get(name))
            pulled.path = path if i == 0 else pulled.path
            pulled.total += path.stat().st_size
            pulled.received += received
            pulled.resumed += resumed
        pulled.seconds = time.perf_counter() - started
    except Exception as err:  # huggingface_hub's errors, worded for the user; others re-raised
        if _is_network_error(err) and not _is_http_error(err):
            return _from_cache(spec, hub, f"{hub.endpoint} cannot be reached ({err.__class__.__name__}: {err})")
        raise _hub_error(err, spec, hub) from None
    return _recorded(pulled)


def _whole(path: Path, size: int | None) -> bool:
    """Whether a file of the cache is there with the size the Hub declares for it (a
    truncated one is not: it is fetched again)."""
    try:
        have = path.stat().st_size
    except FileNotFoundError:
        return False
    return size is None or have == size


def _still_needed(repo: str, files: Sequence[str], listing: Listing, hub: HubSettings) -> int:
    """Bytes the files still need on disk: none for a cached file, the rest for one an
    earlier pull left partly fetched (an LFS file's blob is named by its sha256)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.file_download import repo_folder_name

    blobs = Path(hub.cache_dir, repo_folder_name(repo_id=repo, repo_type="model"), "blobs")
    sizes, lfs, need = listing.sizes, listing.lfs, 0
    for name in files:
        cached = try_to_load_from_cache(repo, name, cache_dir=hub.cache_dir, revision=listing.commit)
        if isinstance(cached, str) and _whole(Path(cached), sizes.get(name)):
            continue
        if name in lfs and _whole(blobs / lfs[name], sizes.get(name)):
            continue  # the same bytes under another name: only a link is made
        partial = blobs / f"{lfs.get(name, '')}.incomplete"
        kept = partial.stat().st_size if name in lfs and partial.is_file() else 0
        need += max(0, (sizes.get(name) or 0) - kept)
    return need


def _recorded(pulled: PulledHf) -> PulledHf:
    """The pull, remembered under its name if it can be served (a pull that fails its
    check leaves the name as it was); ``unrecorded`` says why it could not be written."""
    from .servable import unservable_reason

    if unservable_reason(pulled.path) is None:
        pulled.unrecorded = remember(pulled)
    return pulled


def _download_named(repo: str, filename: str, commit: str, hub: HubSettings, sha256: str | None,
                    size: int | None) -> tuple[Path, int, int]:
    """_download, with a file the listing names but the Hub cannot give named in the error."""
    from huggingface_hub import errors

    try:
        return _download(repo, filename, commit, hub, sha256, size)
    except errors.RemoteEntryNotFoundError:
        raise ModelNotFoundError(f"{repo}: {filename} is in the repo's listing, but {hub.endpoint} answered "
                                 f"404 for it at commit {commit[:12]}: run the pull again later, or name "
                                 "another file") from None


def _download(repo: str, filename: str, commit: str, hub: HubSettings, sha256: str | None,
              size: int | None) -> tuple[Path, int, int]:
    """One file into the cache, resumable, checked against ``sha256`` (the LFS hash model_info
    gave) and its etag; (path in the snapshot, bytes received, bytes resumed). A cached file
    of another size than the Hub's (``size``, model_info's; then resolve/'s) is fetched
    again, and replaces the blob only once verified: a Hub that misstates the size fails
    the pull, it does not cost the blob."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import build_hf_headers

    cached = try_to_load_from_cache(repo, filename, cache_dir=hub.cache_dir, revision=commit)
    if isinstance(cached, str) and _whole(Path(cached), size):
        return Path(cached), 0, 0
    meta = get_hf_file_metadata(hf_hub_url(repo, filename, revision=commit, endpoint=hub.endpoint))
    check_resolved(meta, filename, commit, hub.endpoint)
    blob = Path(hub.cache_dir, repo_folder_name(repo_id=repo, repo_type="model"), "blobs", meta.etag)
    received = resumed = 0
    if not _whole(blob, meta.size):
        if blob.is_file():
            logging.getLogger(__name__).warning("%s in the Hugging Face cache holds %d bytes, not the %d the Hub "
                                                "declares (truncated?): fetched again", filename, blob.stat().st_size,
                                                meta.size)
        partial = blob.with_name(blob.name + ".incomplete")
        blob.parent.mkdir(parents=True, exist_ok=True)
        with claimed(partial, blob, f"{filename} of {repo}"):
            if not _whole(blob, meta.size):  # else another pull finished it while this one waited
                # The token goes only to the Hub itself, never to the CDN a file redirects to.
                same_host = meta.location.startswith(hub.endpoint + "/")
                got = download(meta.location, partial, size=meta.size, name=filename.rsplit("/", 1)[-1],
                               headers=build_hf_headers() if same_host else {})
                resumed, received = got.kept, got.received
                verify(partial, filename, got.sha256, [meta.etag, sha256])
                install(partial, blob, meta.size, filename)
    path = hf_hub_download(repo, filename, revision=commit, cache_dir=hub.cache_dir, endpoint=hub.endpoint)
    return Path(path), received, resumed


# -- the cache, offline ------------------------------------------------------------------
def cached_snapshots(repo: str, hub: HubSettings) -> list[tuple[str, list[str]]]:
    """(commit, files present) of each snapshot of the repo in the cache, newest first."""
    from huggingface_hub.file_download import repo_folder_name

    snapshots = Path(hub.cache_dir, repo_folder_name(repo_id=repo, repo_type="model"), "snapshots")
    found = sorted((p for p in snapshots.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    return [(s.name, sorted(p.relative_to(s).as_posix() for p in s.rglob("*") if p.is_file())) for s in found]


def _cached_choice(spec: HfSpec, hub: HubSettings) -> tuple[str, Choice] | None:
    """The newest snapshot holding every file of the model the spec names. Without a
    quant, what an online pull of the name chose (its index entry), else the default
    quant: the cache may hold one model of a repo that has several, and "the repo's only
    model" would then mean another file offline than online."""
    snapshots = cached_snapshots(spec.repo, hub)
    if spec.tag is None and spec.file is None:
        known = pulled_models().get(spec.name)
        if isinstance(known, dict) and known.get("repo") == spec.repo and isinstance(known.get("files"), list):
            for commit, files in snapshots:
                if commit == known.get("commit") and known["files"] and set(known["files"]) <= set(files):
                    return commit, Choice(tuple(known["files"]))
    for commit, files in snapshots:
        try:
            return commit, choose(spec, files, whole_repo=False)
        except ModelNotFoundError:
            continue
    return None


def cached_model(text: str) -> Path | None:
    """The (first) file of a model already in the cache, found without the network."""
    spec = parse_hf_spec(text)
    hub = hub_settings()
    found = _cached_choice(spec, hub)
    return _snapshot(hub, spec.repo, found[0]) / found[1].first if found is not None else None


def _snapshot(hub: HubSettings, repo: str, commit: str) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return Path(hub.cache_dir, repo_folder_name(repo_id=repo, repo_type="model"), "snapshots", commit)


def not_in_cache(text: str, why: str) -> ModelNotFoundError:
    """The error for a model the cache lacks: what of its repo the cache holds, and which
    split models there miss parts."""
    spec, hub = parse_hf_spec(text), hub_settings()
    snapshots = cached_snapshots(spec.repo, hub)  # one walk of the repo's cache for both lists
    have = sorted({f for _, files in snapshots for f in files if f.endswith(".gguf")})
    gaps = {first: missing for _, files in snapshots for first, missing in incomplete_splits(files).items()}
    note = "".join(f"; {first} lacks {', '.join(missing)}" for first, missing in sorted(gaps.items()))
    return ModelNotFoundError(f"{why}: {spec.name} is not in the Hugging Face cache {hub.cache_dir} "
                              f"(cached from {spec.repo}: {', '.join(have) or 'nothing'}{note})")


def _from_cache(spec: HfSpec, hub: HubSettings, why: str) -> PulledHf:
    found = _cached_choice(spec, hub)
    if found is None:
        raise not_in_cache(spec.name, why)
    commit, choice = found
    snapshot = _snapshot(hub, spec.repo, commit)
    pulled = PulledHf(spec, commit, choice.files, snapshot / choice.first,
                      total=sum((snapshot / f).stat().st_size for f in choice.files))
    return _recorded(pulled)


# -- errors --------------------------------------------------------------------------------
def _is_http_error(err: Exception) -> bool:
    from huggingface_hub.errors import HfHubHTTPError

    return isinstance(err, HfHubHTTPError)


def _is_network_error(err: Exception) -> bool:
    # huggingface_hub's HTTP client raises its own transport errors; they share these base names.
    names = {c.__name__ for c in type(err).__mro__}
    return isinstance(err, (ConnectionError, TimeoutError)) or bool(names & {"TransportError", "TimeoutException"})


def _hub_error(err: Exception, spec: HfSpec, hub: HubSettings) -> Exception:
    from huggingface_hub import errors

    token = "with your token" if _has_token() else "without a token"
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, errors.GatedRepoError):
        if _has_token():
            return CtxError(f"{spec.repo} is gated and your token's account has no access to it yet: accept its "
                            f"terms on its page at {hub.endpoint}/{spec.repo} (some are approved by hand)")
        return CtxError(f"{spec.repo} is gated: accept its terms on the Hub, then set HF_TOKEN (or `hf auth login`)")
    if status == 401 and not isinstance(err, errors.RepositoryNotFoundError):
        if _has_token():
            return CtxError(f"{hub.endpoint} refused the token in HF_TOKEN (or `hf auth login`) for {spec.repo}: "
                            "it is invalid or expired; fix it, or unset it for a public repo")
        return CtxError(f"{hub.endpoint} asks for a token for {spec.repo}: set HF_TOKEN (or `hf auth login`)")
    if isinstance(err, errors.RepositoryNotFoundError):
        return ModelNotFoundError(f"{spec.repo} not found on {hub.endpoint} {token}: check the name, or, if it "
                                  "is private, set HF_TOKEN to a token that may read it")
    if isinstance(err, (errors.RevisionNotFoundError, errors.RemoteEntryNotFoundError)):
        return ModelNotFoundError(f"{spec.repo}: {err.__class__.__name__}: {str(err).splitlines()[0]}")
    if isinstance(err, errors.HfHubHTTPError):
        return CtxError(f"{hub.endpoint}: {str(err).splitlines()[0]}")
    if isinstance(err, OSError) and err.errno is not None:
        return storage_error(err, Path(hub.cache_dir))
    return err


def _has_token() -> bool:
    from huggingface_hub import get_token

    return get_token() is not None


# -- what was pulled -----------------------------------------------------------------------
def _index_path() -> Path:
    return paths.data_dir() / INDEX


def pulled_models() -> dict[str, dict]:
    """Each pulled model's name -> {"repo", "commit", "files", "aliases"}."""
    try:
        data = json.loads(_index_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(pulled: PulledHf) -> str | None:
    """Record the pull under its name and aliases; why not, where the index cannot be written."""
    index = {n: v for n, v in pulled_models().items() if n.lower() != pulled.spec.name.lower()}  # one spelling
    index[pulled.spec.name] = {"repo": pulled.spec.repo, "commit": pulled.commit, "files": list(pulled.files),
                               "aliases": list(pulled.spec.aliases())}
    target = _index_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{INDEX}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, indent=1), encoding="utf-8")
        os.replace(tmp, target)
    except OSError as err:  # the model is in the cache all the same; only the listing misses it
        return (f"{pulled.spec.name} is in the Hugging Face cache, but {target} could not be written "
                f"({err.strerror or err}): it is not listed by name (set CTX_HOME to a writable folder)")
    return None


def pulled_paths(index: dict[str, dict] | None = None) -> list[tuple[str, list[str], Path | None, str | None]]:
    """(name, aliases, first file or None, why not) of every pulled model, from the cache
    (``index``: the index already read, else it is read here)."""
    index = pulled_models() if index is None else index
    if not index:
        return []
    hub = hub_settings()
    out = []
    for name, item in index.items():
        try:
            snapshot = _snapshot(hub, item["repo"], item["commit"])
            files = [snapshot / f for f in item["files"]]
            aliases = [str(a) for a in item.get("aliases", [])]
        except (KeyError, TypeError):
            continue  # an entry another version wrote differently: not ours to read
        gone = [f.name for f in files if not f.is_file()]
        error = f"{', '.join(gone)} gone from the Hugging Face cache {hub.cache_dir}: ctx pull {name}" if gone else None
        out.append((name, aliases, None if gone else files[0], error))
    return out
