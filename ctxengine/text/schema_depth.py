"""How deep a JSON schema's schemas nest, its local ``$ref`` s followed.

llguidance compiles a schema by recursion, a ``$ref`` by compiling what it
names: a chain of a thousand definitions, each naming the next (about 100 KB
of request), overflowed its stack and killed the whole server, every request
on every model with it. The body's own nesting is bounded where it is parsed
(api/limits.py); a chain of refs nests without nesting the JSON, so it is
measured here, before llguidance sees the schema, and refused past
MAX_SCHEMA_DEPTH. A ref already on the path (recursion: a list, a tree) ends
the path, as llguidance defers it; each ref's depth is worked out once, so a
definition named twice by each of a hundred others costs no more than once.
"""
from __future__ import annotations

from typing import Any, Callable

from .json_bounds import local_resolver

MAX_SCHEMA_DEPTH = 256  # schemas within schemas; real ones stay under a few dozen


def check_depth(schema: Any) -> None:
    """ValueError when ``schema`` nests deeper than MAX_SCHEMA_DEPTH, its refs followed."""
    if schema_depth(schema, local_resolver(schema)) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"its schemas nest more than {MAX_SCHEMA_DEPTH} deep (its $refs followed: each "
                         f"one counts as deep as what it names)")


def schema_depth(schema: Any, resolve: Callable[[str], Any], limit: int = MAX_SCHEMA_DEPTH) -> int:
    """The deepest nesting of dicts and lists in ``schema``, each local ``$ref`` replaced
    by what ``resolve`` gives for it (None: left as is); counting stops past ``limit``."""
    below: dict[str, int] = {}  # a ref -> the depth of what it names, once known
    on_path: set[str] = set()

    def depth(node: Any, left: int) -> int:
        if left < 0:
            return 0  # past the limit: the caller has its answer
        if isinstance(node, list):
            return 1 + max((depth(v, left - 1) for v in node), default=0)
        if not isinstance(node, dict):
            return 0
        here = 1 + max((depth(v, left - 1) for k, v in node.items() if k != "$ref"), default=0)
        ref = node.get("$ref")
        if not isinstance(ref, str) or ref in on_path:
            return here
        if ref not in below:
            target = resolve(ref)
            on_path.add(ref)
            try:
                below[ref] = depth(target, left - 1) if target is not None else 0
            finally:
                on_path.discard(ref)
        return max(here, 1 + below[ref])

    return depth(schema, limit)
