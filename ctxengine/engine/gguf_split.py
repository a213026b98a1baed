"""Split GGUF files: one model in several files, as llama.cpp's gguf-split
and gguf-py's GGUFWriter(split_max_tensors=...) write them.

The parts are named ``PREFIX-00001-of-0000N.gguf`` ... ``PREFIX-0000N-of-0000N.gguf``
(llama.cpp's ``llama_split_path``: "%s-%05d-of-%05d.gguf", numbered from 1).
Each part is a complete GGUF file carrying ``split.no`` (u16, from 0),
``split.count`` (u16) and ``split.tensors.count`` (i32, the tensors of all
parts together); the first part also holds every other metadata key, the
later ones only their share of the tensors. Opened by its first part, a set
reads as one model (gguf_file.GGUFFile joins the parts' tensors, in part
order, so a split set has the weight id of the unsplit file).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ModelFileError

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS = "split.tensors.count"
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
MAX_PARTS = 99999


def split_part_path(prefix: str, no: int, count: int) -> str:
    """The name of part ``no`` (from 1) of ``count``: llama.cpp's llama_split_path."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def split_name_parts(name: str) -> tuple[str, int, int] | None:
    """(prefix, part number from 1, part count) for a split part's file name, else None."""
    m = SPLIT_NAME.match(name)
    if m is None or not 1 <= int(m["no"]) <= int(m["count"]):
        return None
    return m["prefix"], int(m["no"]), int(m["count"])


def is_later_part(path: str | Path) -> bool:
    """A part after the first: not a model by itself (its first part opens the set)."""
    parts = split_name_parts(Path(path).name)
    return parts is not None and parts[1] > 1


def split_set_paths(path: str | Path) -> list[Path]:
    """Every file of the set a first part names (by name: the part count is in it),
    or just ``[path]`` for a file that is not a first part."""
    path = Path(path)
    parts = split_name_parts(path.name)
    if parts is None or parts[1] != 1:
        return [path]
    prefix, _, count = parts
    return [path.with_name(split_part_path(prefix, no, count)) for no in range(1, count + 1)]


def split_count(metadata: dict[str, Any], name: str) -> int:
    """How many files the model is in (1 for an unsplit file); a later part refused."""
    count = metadata.get(SPLIT_COUNT, 1)
    no = metadata.get(SPLIT_NO, 0)
    if type(count) is not int or not 1 <= count <= MAX_PARTS:
        raise ModelFileError(f"{name}: {SPLIT_COUNT} must be 1 to {MAX_PARTS}, not {count!r}")
    if no != 0:
        raise ModelFileError(f"{name}: part {no + 1 if type(no) is int else no!r} of a split model; "
                             f"open its first part (-00001-of-{count:05d}.gguf)")
    return count


def later_part_paths(first: Path, count: int) -> list[Path]:
    """The files of parts 2..count, found next to the first as llama.cpp finds them."""
    parts = split_name_parts(first.name)
    if parts is None or parts[1] != 1 or parts[2] != count:
        raise ModelFileError(f"{first.name}: {SPLIT_COUNT} is {count}, so the file must be named "
                             f"PREFIX-00001-of-{count:05d}.gguf to find its other parts")
    missing = [p for p in split_set_paths(first)[1:] if not p.is_file()]
    if missing:
        raise ModelFileError(f"{first.name}: split model part {missing[0].name} is missing "
                             f"({len(missing)} of {count} parts missing from {first.parent})")
    return split_set_paths(first)[1:]


def check_later_part(metadata: dict[str, Any], no: int, count: int, name: str) -> None:
    """A later part must say which part of how many it is, as the first part said."""
    if metadata.get(SPLIT_NO) != no or metadata.get(SPLIT_COUNT) != count:
        raise ModelFileError(f"{name}: says it is part {metadata.get(SPLIT_NO)!r} of "
                             f"{metadata.get(SPLIT_COUNT)!r}, expected part {no} of {count} (0-based)")


def check_tensor_total(metadata: dict[str, Any], n_tensors: int, name: str) -> None:
    expected = metadata.get(SPLIT_TENSORS)
    if expected is not None and expected != n_tensors:
        raise ModelFileError(f"{name}: the split parts hold {n_tensors} tensors, "
                             f"{SPLIT_TENSORS} says {expected!r}")
