"""A Hub repo's listing at its newest commit: the commit, and each file's size and
(LFS files) sha256, which name a snapshot and blobs in the cache before any byte
moves.

Asked for as ``HfApi.model_info(repo, files_metadata=True)`` asks
(``GET {endpoint}/api/models/{repo}?blobs=True``), through huggingface_hub's own
HTTP session, headers (the token, its user agent) and error mapping
(``hf_raise_for_status``: a missing repo, a gated one, a 401), but read here
rather than by ``HfApi``: importing ``huggingface_hub.hf_api`` brings the whole
client with it (inference endpoints, jobs, spaces, repo cards), 0.17 s of the
0.6 s a pull spent before its first byte on a 2-core machine
(docs/PERFORMANCE.md), and the three fields a pull reads must be checked before
they name a path whoever parses them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import CtxError
from .hf_transfer import COMMIT, SHA256, not_understood, plausible_size


@dataclass(frozen=True)
class Listing:
    commit: str
    sizes: dict[str, int | None]   # every file -> its bytes (None: the Hub did not say)
    lfs: dict[str, str]            # each LFS file -> its sha256 (lower case)


def repo_listing(repo: str, endpoint: str) -> Listing:
    """The listing of ``repo`` on the Hub at ``endpoint``. An answer that is not a repo's
    listing (a proxy's HTML page, JSON of another shape, or nested past Python's
    recursion limit) is said to be that, on one line."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status, validate_repo_id

    validate_repo_id(repo)  # as model_info's decorator does: the name we give, refused before a request
    r = get_session().get(f"{endpoint}/api/models/{repo}", headers=build_hf_headers(), params={"blobs": True})
    hf_raise_for_status(r)
    what = f"model_info for {repo}"
    try:
        data = json.loads(r.content)
    except ValueError:
        raise not_understood(endpoint, what, "not JSON") from None
    except RecursionError:
        raise not_understood(endpoint, what, "JSON nested too deep") from None
    return read_listing(data, endpoint, what)


def read_listing(data, endpoint: str, what: str) -> Listing:
    """The Listing in model_info's JSON answer; a field of another type or form is refused
    here, not tripped over later."""
    def refuse(why: str) -> CtxError:
        return not_understood(endpoint, what, why)

    if not isinstance(data, dict):
        raise refuse(f"not a repo's listing: a JSON {type(data).__name__}")
    commit = data.get("sha")
    if not (isinstance(commit, str) and COMMIT.fullmatch(commit)):
        raise refuse(f"its commit is {_short(commit)}")
    siblings = data.get("siblings")
    siblings = [] if siblings is None else siblings
    if not isinstance(siblings, list):
        raise refuse(f"its files are a JSON {type(siblings).__name__}, not a list")
    sizes: dict[str, int | None] = {}
    lfs: dict[str, str] = {}
    for s in siblings:
        if not isinstance(s, dict):
            raise refuse(f"a file's entry is {_short(s)}")
        name, size, blob = s.get("rfilename"), s.get("size"), s.get("lfs") or None
        if not isinstance(name, str):
            raise refuse(f"a file's name is {_short(name)}")
        if size is not None and not plausible_size(size):
            raise refuse(f"{_short(name)} is {_short(size)} bytes")
        if blob is not None:
            if not isinstance(blob, dict):
                raise refuse(f"{_short(name)} has the LFS entry {_short(blob)}")
            sha256 = blob.get("sha256")
            if not (isinstance(sha256, str) and SHA256.fullmatch(sha256.lower())):
                raise refuse(f"{_short(name)} has the sha256 {_short(sha256)}")
            lfs[name] = sha256.lower()
        sizes[name] = size
    return Listing(commit, sizes, lfs)


def _short(value) -> str:
    """A value of the Hub's answer as it reads in an error: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
