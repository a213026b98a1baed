"""Stubs generated from proto/ctxengine/v1/*.proto by scripts/gen_proto.py; do not edit.

tests/test_rpc_proto.py fails when they are stale.
"""
