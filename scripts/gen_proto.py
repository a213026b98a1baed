"""Regenerate the gRPC stubs in ctxengine/rpc/v1/ from proto/ctxengine/v1/*.proto.

    python scripts/gen_proto.py            # rewrite the committed stubs
    python scripts/gen_proto.py --check    # exit 1 if they are stale

Needs grpcio-tools (a test dependency). protoc names generated imports after
the proto package (``from ctxengine.v1 import ...``); the stubs live in
``ctxengine.rpc.v1``, so those imports are made relative. tests/test_rpc_proto.py
regenerates into a temporary folder and compares.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "proto"
PROTO_DIR = PROTO_ROOT / "ctxengine" / "v1"
STUBS = REPO / "ctxengine" / "rpc" / "v1"
GENERATED = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
_ABSOLUTE = re.compile(r"^from ctxengine\.v1 import ", re.M)
# Lines that name the generator's version: a stub made by another grpcio-tools
# release is not stale (pyproject.toml's floors say which runtimes it needs).
VERSION_LINES = re.compile(r"^(# Protobuf Python Version: .*|GRPC_GENERATED_VERSION = .*|\s+\d+,)$", re.M)


def generate(dest: Path) -> list[Path]:
    """Write the stubs for every .proto into ``dest``; return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(PROTO_DIR.glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *map(str, protos)]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed (see above)")
        dest.mkdir(parents=True, exist_ok=True)
        written = []
        for path in sorted((Path(tmp) / "ctxengine" / "v1").iterdir()):
            out = dest / path.name
            out.write_text(_ABSOLUTE.sub("from . import ", path.read_text()))
            written.append(out)
    return written


def stale(committed: Path = STUBS) -> list[str]:
    """Names of the stubs that differ from what the .proto files generate now."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        names = set(fresh) | {p.name for p in committed.iterdir() if p.name.endswith(GENERATED)}
        return sorted(n for n in names
                      if not (committed / n).exists() or n not in fresh
                      or _comparable((committed / n).read_text()) != _comparable(fresh[n].read_text()))


def _comparable(text: str) -> str:
    return VERSION_LINES.sub("", text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only report stale stubs (exit 1 if any)")
    args = p.parse_args()
    if args.check:
        names = stale()
        for n in names:
            print(f"stale: ctxengine/rpc/v1/{n}")
        return 1 if names else 0
    for path in generate(STUBS):
        print(path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
