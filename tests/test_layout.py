"""The package's layout, checked (docs/architecture.md): every import of
ours goes down the layers, the faces (api/, rpc/) reach below serving/ only
for text and errors, no modules import each other in a cycle, and no file or
function grows past the size one reads at once.

The import graph is read with ``ast`` from the sources, so a test run needs
no import of the package. Every import counts, those inside functions and
under ``if TYPE_CHECKING:`` too: a function-level import that only dodges a
cycle is still a cycle, and a type that points up or round a loop is the
same dependency, only unspoken.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ctxengine"

# Top to bottom; a unit imports its own modules and those of units in lower
# layers only. Units side by side (api, rpc) do not import each other.
LAYERS = [
    ("cli",),                        # the ctx command
    ("api", "rpc"),                  # the HTTP and gRPC faces
    ("serving",),                    # runtime, prefix cache, fleet host, the served catalog
    ("bench",),                      # ctx bench / ctx verify's library, which bench/*.py imports too
    ("ctxengine",),                  # the public face: ctxengine/__init__.py (load, Model, Store)
    ("state",),                      # Model, Context, ContextTable, snapshots, eviction
    ("sources",),                    # the model sources ce.load and the served catalog ask
    ("ollama",),                     # Ollama's store and Go templates: a model source the layers above pass down
    ("engine",),                     # GGUF, weights identity, the Engine, scheduler, sampler, catalog
    ("text",),                       # tokenizers, chat rendering, tool-call text, grammars
    ("store",),                      # the snapshot store: imports errors only
    ("errors", "paths", "version", "_core"),  # the ground everything stands on
]
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}
STORE_MAY_IMPORT = {"store", "errors"}  # it keeps bytes and knows no model
# The faces translate wire formats to serving's calls and back; what they need
# from below, serving names (serving/exports.py). Text is below every layer's
# concern but the store's, and errors are everyone's.
FACES = ("api", "rpc")
FACES_MAY_IMPORT = {"serving", "text", "errors"}

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
GENERATED = ("ctxengine/rpc/v1/",)  # protoc output (*_pb2.py, *_pb2_grpc.py)


@dataclass(frozen=True)
class Import:
    source: str       # the importing module
    target: str       # the imported module
    line: int
    type_only: bool   # under `if TYPE_CHECKING:`


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _known(name: str, mods: dict[str, Path]) -> bool:
    return name in mods or name == "ctxengine._core"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers of the statements under an `if TYPE_CHECKING:`."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for stmt in node.body:
                lines.update(range(stmt.lineno, stmt.end_lineno + 1))
    return lines


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, mods: dict[str, Path]) -> list[str]:
    """The modules of ours an import statement loads (the module a name comes from,
    or the submodule when the name is one)."""
    if isinstance(node, ast.Import):
        out = []
        for alias in node.names:
            name = alias.name
            while name and not _known(name, mods):
                name = name.rpartition(".")[0]
            if name:
                out.append(name)
        return out
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if _known(sub, mods):
            out.append(sub)
        elif _known(base, mods):
            out.append(base)
    return out


def imports() -> list[Import]:
    mods = modules()
    found = []
    for module, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        type_only = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, path.name == "__init__.py", mods):
                    if target != module:
                        found.append(Import(module, target, node.lineno, node.lineno in type_only))
    return found


def unit(module: str) -> str:
    """The layer unit of a module: its folder under ctxengine, or the module itself at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ctxengine"


def cycles(edges: list[Import]) -> list[list[str]]:
    """Each strongly connected group of modules (Tarjan), as a list; one that imports itself too."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_graph_is_read():
    """The reader finds imports of every kind, so the checks below have something to check."""
    edges = {(e.source, e.target, e.type_only) for e in imports()}
    assert ("ctxengine.state.model", "ctxengine.engine.engine", False) in edges      # from ..engine.engine import
    assert ("ctxengine.engine.engine", "ctxengine._core", False) in edges           # from .. import _core
    assert ("ctxengine.text.tokenizer", "ctxengine.text.tokenizer_bpe", False) in edges  # from . import module
    assert ("ctxengine.state.table", "ctxengine.engine.engine", True) in edges      # under TYPE_CHECKING
    assert ("ctxengine", "ctxengine.state.model", False) in edges                   # inside a function (__getattr__)
    assert set(RANK) >= {unit(m) for m in modules()}, "a folder with no layer: add it to LAYERS"


def test_no_import_cycles():
    """No modules import each other round a loop, counting every import: those under
    TYPE_CHECKING and inside functions too (where two modules need each other's
    types, the lower one names the shape it needs, as state/'s Protocols do)."""
    found = cycles(imports())
    assert not found, "modules that import each other (directly or round a loop):\n" + \
        "\n".join(" <-> ".join(g) for g in found)


def test_imports_go_down_the_layers():
    wrong = []
    for e in imports():
        a, b = unit(e.source), unit(e.target)
        if a == b:
            continue
        if RANK[b] <= RANK[a]:
            wrong.append(f"{e.source}:{e.line} imports {e.target} ({a} -> {b})")
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def test_the_store_imports_nothing_of_ours_but_errors():
    wrong = [f"{e.source}:{e.line} imports {e.target}" for e in imports()
             if unit(e.source) == "store" and unit(e.target) not in STORE_MAY_IMPORT]
    assert not wrong, "\n".join(wrong)


def test_the_faces_import_only_serving_text_and_errors():
    wrong = [f"{e.source}:{e.line} imports {e.target}" for e in imports()
             if unit(e.source) in FACES and unit(e.target) not in FACES_MAY_IMPORT | {unit(e.source)}]
    assert not wrong, "faces reaching below serving/ (name what they need in serving/exports.py):\n" + \
        "\n".join(wrong)


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if not rel.startswith(GENERATED):
            yield rel, path


def test_no_file_is_too_long():
    long = [f"{rel}: {n} lines" for rel, path in _sources()
            if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by concept):\n" + "\n".join(long)


def test_no_function_is_too_long():
    long = []
    for rel, path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


@pytest.mark.parametrize("edges, expected", [
    ([("a", "b"), ("b", "c")], []),
    ([("a", "b"), ("b", "a")], [["a", "b"]]),
    ([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")], [["a", "b", "c"]]),
])
def test_cycles_finds_loops(edges, expected):
    assert cycles([Import(a, b, 1, False) for a, b in edges]) == expected
