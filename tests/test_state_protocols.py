"""What state/'s lower modules name of a Context and of its table, as typing
Protocols so that their imports go one way (docs/architecture.md), is what
Context and ContextTable have: nothing checks the types, so this checks the
names, with no model loaded."""
from types import SimpleNamespace

import pytest

from ctxengine.state.context import Context, Table
from ctxengine.state.conversation import Conversant
from ctxengine.state.speculation import Relatives, Speculating
from ctxengine.state.table import ContextTable


def members(proto: type) -> set[str]:
    """The attributes, properties and methods a Protocol declares."""
    declared = set(vars(proto).get("__annotations__", {}))
    declared |= {n for n, v in vars(proto).items() if callable(v) or isinstance(v, property)}
    return {n for n in declared if not n.startswith("__")}


def has(obj, name: str) -> bool:
    """Set on the instance or defined by its class (a property is not run)."""
    return name in vars(obj) or hasattr(type(obj), name)


@pytest.fixture
def table() -> ContextTable:
    return ContextTable(SimpleNamespace(pool=SimpleNamespace(page_tokens=16)))


@pytest.mark.parametrize("proto", [Conversant, Speculating, Table, Relatives])
def test_a_protocol_names_what_its_implementation_has(proto, table):
    ctx = Context(table, "c", seq=None)
    impl = table if proto in (Table, Relatives) else ctx
    assert members(proto), f"{proto.__name__} declares nothing"
    missing = sorted(n for n in members(proto) if not has(impl, n))
    assert not missing, f"{type(impl).__name__} lacks {proto.__name__}'s {missing}"
