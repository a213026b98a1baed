"""Snapshot store: content-addressed KV pages, manifests and refs in LMDB.

Imports nothing of ctxengine but ``ctxengine.errors``: it keeps bytes and
knows no model. Formats: docs/store-format.md.
"""
from .maintenance import GCResult, StoreStats
from .manifest import MANIFEST_FORMAT, Manifest
from .names import validate_name
from .pages import page_key
from .refs import RefLogEntry
from .store import Store, default_store_path

__all__ = [
    "GCResult", "MANIFEST_FORMAT", "Manifest", "RefLogEntry", "Store", "StoreStats",
    "default_store_path", "page_key", "validate_name",
]
