"""ctxengine/_core.pyi describes the built module: no name missing, none invented."""
import ast
import inspect
from pathlib import Path

from ctxengine import _core

STUB = Path(_core.__file__).with_name("_core.pyi")
if not STUB.exists():  # an editable install keeps the .so elsewhere
    STUB = Path(__file__).resolve().parents[1] / "ctxengine" / "_core.pyi"


def public(names) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def stub_tree():
    tree = ast.parse(STUB.read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return public(top), classes


def test_every_public_name_of_the_module_is_declared_and_vice_versa():
    top, _ = stub_tree()
    assert top == public(dir(_core))


def test_every_class_member_is_declared_and_vice_versa():
    _, classes = stub_tree()
    for name in public(dir(_core)):
        obj = getattr(_core, name)
        if inspect.isclass(obj):
            assert classes[name] - {"__init__"} == public(dir(obj)), name


def test_the_quant_submodule_is_declared_and_vice_versa():
    _, classes = stub_tree()
    assert classes["_Quant"] == public(dir(_core.quant))
