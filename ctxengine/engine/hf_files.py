"""Which GGUF file of a Hugging Face repo a name means, as llama.cpp's ``-hf``
chooses it.

    hf://ORG/REPO[:QUANT]        hf.co/ORG/REPO[:QUANT] (Ollama's spelling)   ORG/REPO:QUANT (-hf)
    hf://ORG/REPO/PATH/FILE.gguf one file by its path in the repo

A quant tag is matched case-insensitively in the file names: a file where
it stands as a whole token (``q4_k_m`` in ``SmolLM2-Q4_K_M.gguf``, but not
``q4_k`` there) wins over one that merely contains it; more than one choice
left, or none, is an error listing the choices. No tag means ``Q4_K_M``, as
in llama.cpp, or the repo's only model file. A split model (``-00001-of-
0000N.gguf``) is one choice standing for all its parts; multimodal
projector files (``mmproj``) are never a model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidNameError, ModelNotFoundError
from .gguf_split import split_name_parts, split_part_path

DEFAULT_QUANT = "Q4_K_M"
PREFIXES = ("hf://", "hf.co/", "huggingface.co/", "https://huggingface.co/")
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")   # the Hub's repo id parts


@dataclass(frozen=True)
class HfSpec:
    repo: str              # ORG/REPO
    tag: str | None        # the quant asked for, as typed
    file: str | None       # or one file's path in the repo

    @property
    def name(self) -> str:
        """The name a pulled model is listed and served by (Ollama's spelling)."""
        return f"hf.co/{self.repo}/{self.file}" if self.file else f"hf.co/{self.repo}:{self.tag or 'latest'}"

    def aliases(self) -> tuple[str, ...]:
        short = f"{self.repo}/{self.file}" if self.file else f"{self.repo}:{self.tag or 'latest'}"
        return (short, f"hf://{short}") + ((f"hf.co/{self.repo}", f"hf://{self.repo}") if not self.tag and not self.file else ())


def is_hf_spec(spec: str) -> bool:
    return spec.lower().startswith(PREFIXES)


def parse_hf_spec(spec: str) -> HfSpec:
    """``hf://ORG/REPO[:QUANT]``, ``hf://ORG/REPO/FILE.gguf`` (or without the scheme, for -hf)."""
    rest = spec.strip()
    for prefix in PREFIXES:
        if rest.lower().startswith(prefix):
            rest = rest[len(prefix):]
            break
    parts = rest.split("/")
    tag = None
    if len(parts) == 2 and ":" in parts[1]:
        parts[1], tag = parts[1].split(":", 1)
        if tag.lower() == "latest":  # the name a pull without a tag is listed by (HfSpec.name)
            tag = None
    if len(parts) < 2 or not all(_PART.match(p) for p in parts[:2]) or tag == "":
        raise InvalidNameError(f"'{spec}' is not a Hugging Face model: write hf://ORG/REPO[:QUANT] "
                               "or hf://ORG/REPO/FILE.gguf")
    _check_repo_id(spec, f"{parts[0]}/{parts[1]}")
    file = "/".join(parts[2:]) or None
    if file is not None and (not file.endswith(".gguf") or ".." in parts[2:] or "" in parts[2:]):
        raise InvalidNameError(f"'{spec}': a file in a repo must be a path ending in .gguf")
    return HfSpec(f"{parts[0]}/{parts[1]}", tag, file)


def _check_repo_id(spec: str, repo: str) -> None:
    """The Hub's own rules for a repo id (no "--" or "..", at most 96 characters), as
    huggingface_hub checks them before any request: refused here as a bad name."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise InvalidNameError(f"'{spec}' is not a Hugging Face model: {err}") from None


@dataclass(frozen=True)
class Choice:
    files: tuple[str, ...]   # the model's file, or every part of a split model in order

    @property
    def first(self) -> str:
        return self.files[0]


def model_choices(files: list[str]) -> list[Choice]:
    """The repo's models: its .gguf files, a split set as one, projectors left out."""
    present = set(files)
    out = []
    for f in sorted(files):
        base = f.rsplit("/", 1)[-1]
        if not base.lower().endswith(".gguf") or "mmproj" in base.lower():
            continue
        split = split_name_parts(base)
        if split is None:
            out.append(Choice((f,)))
        elif split[1] == 1:
            folder = f[: len(f) - len(base)]
            parts = tuple(folder + split_part_path(split[0], no, split[2]) for no in range(1, split[2] + 1))
            if all(p in present for p in parts):
                out.append(Choice(parts))
    return out


def incomplete_splits(files: list[str]) -> dict[str, list[str]]:
    """Split models some of whose parts are missing: their first part's path (as a whole
    set would be listed) -> the names of the parts that are not there."""
    present = set(files)
    sets: dict[tuple[str, str, int], set[int]] = {}
    for f in files:
        base = f.rsplit("/", 1)[-1]
        split = split_name_parts(base)
        if split is not None:
            sets.setdefault((f[: len(f) - len(base)], split[0], split[2]), set()).add(split[1])
    out = {}
    for (folder, prefix, count), _ in sorted(sets.items()):
        names = [folder + split_part_path(prefix, no, count) for no in range(1, count + 1)]
        missing = [n.rsplit("/", 1)[-1] for n in names if n not in present]
        if missing:
            out[names[0]] = missing
    return out


def _incomplete_note(spec: "HfSpec", files: list[str]) -> str:
    gaps = incomplete_splits(files)
    if not gaps:
        return ""
    shown = "; ".join(f"{first} lacks {', '.join(missing)}" for first, missing in gaps.items())
    return f"; split models with parts missing in {spec.repo}: {shown}"


def safe_path(name: str) -> bool:
    """A file name a repo listing may hold that stays inside the folder it is put in."""
    parts = name.split("/")
    return bool(name) and "\\" not in name and "\0" not in name and all(p not in ("", ".", "..") for p in parts)


def choose(spec: HfSpec, files: list[str], *, whole_repo: bool = True) -> Choice:
    """The model a spec means among a repo's files (an error lists the choices); names that
    would lead out of the cache's folder (``../x.gguf``, ``/x.gguf``) are never a choice.
    ``whole_repo``: the files are all the repo's, so its only model is the one a spec
    without a quant means (not so for the part of it a cache holds)."""
    files = [f for f in files if safe_path(f)]
    choices = model_choices(files)
    if spec.file is not None:
        found = next((c for c in choices if c.first == spec.file), None)
        if found is None and spec.file in files:
            found = Choice((spec.file,))  # a file our choices leave out (a later part, say): as asked
        if found is None:
            raise ModelNotFoundError(f"{spec.repo} has no file {spec.file}; {_listing(spec, choices)}")
        return found
    if not choices:
        raise ModelNotFoundError(f"{spec.repo} has no whole GGUF model (files: {', '.join(sorted(files)[:12])})"
                                 + _incomplete_note(spec, files))
    tag = spec.tag or DEFAULT_QUANT
    matches = _matching(tag, choices)
    if len(matches) == 1:
        return matches[0]
    if not matches and spec.tag is None and len(choices) == 1 and whole_repo:
        return choices[0]
    if matches:
        raise ModelNotFoundError(f"quant '{tag}' is ambiguous in {spec.repo}: it matches "
                                 f"{', '.join(c.first for c in matches)}; name one more exactly "
                                 f"(hf://{spec.repo}:QUANT or hf://{spec.repo}/FILE.gguf)")
    asked = f"no file matches quant '{tag}'" if spec.tag else f"no quant given and no {DEFAULT_QUANT} file"
    raise ModelNotFoundError(f"{asked} in {spec.repo}; {_listing(spec, choices)}{_incomplete_note(spec, files)}")


def _matching(tag: str, choices: list[Choice]) -> list[Choice]:
    needle = tag.lower()
    token = re.compile(rf"(?<![a-z0-9_]){re.escape(needle)}(?![a-z0-9_])")
    names = [(c, c.first.rsplit("/", 1)[-1].lower()) for c in choices]
    whole = [c for c, n in names if token.search(n)]
    return whole or [c for c, n in names if needle in n]


def _listing(spec: HfSpec, choices: list[Choice]) -> str:
    shown = ", ".join(c.first + (f" (+{len(c.files) - 1} parts)" if len(c.files) > 1 else "") for c in choices)
    return f"its models: {shown or 'none'} (pick one with hf://{spec.repo}:QUANT)"
