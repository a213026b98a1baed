"""The protocol files: stubs in step with the .proto files, every field documented."""
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROTOS = sorted((REPO / "proto" / "ctxengine" / "v1").glob("*.proto"))


def _gen_proto():
    spec = importlib.util.spec_from_file_location("gen_proto", REPO / "scripts" / "gen_proto.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_stubs_match_the_proto_files():
    stale = _gen_proto().stale()
    assert not stale, f"stale stubs {stale}: run python scripts/gen_proto.py"


def test_a_changed_proto_is_caught(tmp_path):
    gen = _gen_proto()
    committed = tmp_path / "v1"
    committed.mkdir()
    for path in gen.generate(committed):
        if path.name == "snapshot_pb2.py":
            path.write_text(path.read_text().replace("weight_id", "weight_ix"))  # as if the .proto changed
        if path.name == "context_pb2.pyi":
            path.unlink()
    assert gen.stale(committed) == ["context_pb2.pyi", "snapshot_pb2.py"]


@pytest.mark.parametrize("proto", PROTOS, ids=lambda p: p.name)
def test_every_field_and_rpc_has_a_comment(proto):
    lines = proto.read_text().splitlines()
    field = re.compile(r"^\s+(optional |repeated )?[\w.<>, ]+ \w+ = \d+;|^\s+rpc \w+\(")
    undocumented = []
    for i, line in enumerate(lines):
        if field.match(line):
            j = i - 1
            if not lines[j].strip().startswith("//"):
                undocumented.append(line.strip())
    assert not undocumented, f"fields without a comment in {proto.name}: {undocumented}"


def test_both_services_are_versioned():
    from ctxengine.rpc.v1 import context_pb2, snapshot_pb2

    assert context_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name == "ctxengine.v1.ContextService"
    methods = set(snapshot_pb2.DESCRIPTOR.services_by_name["SnapshotService"].methods_by_name)
    assert methods == {"Models", "MissingPages", "PutPages", "GetPages", "PutManifest", "GetManifest",
                       "SetRef", "GetRef", "ListRefs"}
